"""Checks of an Edge-LLM model directory written by `deamoe-trt export-edgellm`, on the CPU.

- `graph_differences(ours, vanilla)`: what differs between our export and Edge-LLM's own export
  of a Qwen3-MoE model with the same non-MoE weights, apart from the MoE layers: graph inputs
  and outputs (names, dtypes, shapes), every node (op, domain, attributes, wiring), every
  initializer (dtype, shape, bytes), opsets, and the files beside the graph (config.json,
  embedding.safetensors, tokenizer files, chat template). Tensor names that torch.export
  numbers (they shift when the MoE layers have other ops) are compared by position: each
  value is named by the order in which the graph first uses it. A MoE layer is, in Edge-LLM's
  graph, its MoE plugin node and the router chain (Reshape, Gemm, Cast) that feeds it; in
  ours, the one DeaMoE node.
- `node_checks(ours, lm)`: each DeaMoE node cut out into a model of its own and run on ONNX
  Runtime through the reference op (validation/plugin_op.py), against the LM checkpoint's
  layer (PyTorch, fp16) through validation's adapter (pair.compare_layers); and its weight
  inputs against the checkpoint's tensors.

The whole graph's numerics need Edge-LLM's AttentionPlugin, which exists only as a TensorRT
plugin on a GPU (docs/edge-llm.md).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from ... import contract
from ...export import plugin_node

LLM = "llm"
MODEL = "model.onnx"
# Files of Edge-LLM's model directory that must be byte-identical (config.json is compared parsed).
SAME_FILES = ("embedding.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
EDGELLM_MOE_DOMAIN = "trt_edgellm"


def is_moe_node(node: onnx.NodeProto) -> bool:
    if (node.op_type, node.domain) == (contract.OP_TYPE, contract.DOMAIN):
        return True
    return node.domain == EDGELLM_MOE_DOMAIN and node.op_type.endswith(("MoePlugin", "MoEPluginGeforce"))


def moe_regions(graph: onnx.GraphProto) -> dict[int, tuple[str, str]]:
    """Node index -> (hidden states in, output) for the MoE plugin nodes; -> ("", "") for the
    nodes of their router chains (what feeds a plugin's inputs other than the hidden states
    and initializers, back to the hidden states)."""
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output}
    regions: dict[int, tuple[str, str]] = {}
    for i, node in enumerate(graph.node):
        if not is_moe_node(node):
            continue
        ours = node.domain == contract.DOMAIN
        hidden = node.input[0] if ours else node.input[1]
        regions[i] = (hidden, node.output[0])
        pending = [] if ours else [name for k, name in enumerate(node.input) if k != 1]
        while pending:
            name = pending.pop()
            j = producer.get(name)
            if name == hidden or j is None or j in regions:
                continue
            regions[j] = ("", "")
            pending.extend(graph.node[j].input)
    return regions


def _attribute(attr: onnx.AttributeProto):
    value = helper.get_attribute_value(attr)
    if isinstance(value, onnx.TensorProto):
        return (value.data_type, tuple(value.dims), numpy_helper.to_array(value).tobytes())
    return value


def _value_info(v: onnx.ValueInfoProto) -> tuple:
    t = v.type.tensor_type
    return v.name, t.elem_type, tuple(d.dim_param or d.dim_value for d in t.shape.dim)


@dataclass
class GraphSignature:
    """A graph with its MoE layers folded to one placeholder each and torch.export's numbered
    names replaced by first-use order."""

    inputs: list[tuple]
    outputs: list[tuple]
    nodes: list[tuple]
    initializers: dict[str, tuple]
    opsets: dict[str, int]
    moe_layers: int


def signature(model: onnx.ModelProto) -> GraphSignature:
    graph = model.graph
    io = {v.name for v in (*graph.input, *graph.output)}
    initializers = {t.name: t for t in graph.initializer}
    names: dict[str, str] = {}

    def canon(name: str) -> str:
        if not name or name in io:
            return name
        return names.setdefault(name, f"v{len(names)}")

    regions = moe_regions(graph)
    nodes = []
    for i, node in enumerate(graph.node):
        if i in regions:
            hidden, output = regions[i]
            if hidden:
                nodes.append(("MoE", canon(hidden), canon(output)))
            continue
        attrs = tuple(sorted((a.name, _attribute(a)) for a in node.attribute))
        wiring = (tuple(canon(n) for n in node.input), tuple(canon(n) for n in node.output))
        nodes.append((node.domain, node.op_type, *wiring, attrs))
    tensors = {}
    for name, canonical in names.items():
        if name in initializers:
            t = initializers[name]
            data = numpy_helper.to_array(t).tobytes()
            tensors[canonical] = (t.data_type, tuple(t.dims), hashlib.sha256(data).hexdigest())
    opsets = {o.domain: o.version for o in model.opset_import if o.domain != contract.DOMAIN}
    moe = sum(1 for i, (hidden, _) in regions.items() if hidden)
    return GraphSignature(
        [_value_info(v) for v in graph.input], [_value_info(v) for v in graph.output], nodes, tensors, opsets, moe
    )


def _first_difference(a: list, b: list) -> str:
    for k, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"at {k}: {x!r:.300} vs {y!r:.300}"
    return f"lengths {len(a)} vs {len(b)}"


def graph_differences(ours: str | Path, vanilla: str | Path) -> list[str]:
    """What differs between two Edge-LLM model directories outside their MoE layers (empty: nothing)."""
    ours_llm, vanilla_llm = Path(ours) / LLM, Path(vanilla) / LLM
    problems = []
    a, b = signature(onnx.load(ours_llm / MODEL)), signature(onnx.load(vanilla_llm / MODEL))
    for field in ("inputs", "outputs", "nodes"):
        x, y = getattr(a, field), getattr(b, field)
        if x != y:
            problems.append(f"graph {field} differ {_first_difference(x, y)}")
    if a.initializers != b.initializers:
        keys = sorted(set(a.initializers) | set(b.initializers), key=lambda k: int(k[1:]))
        first = next(k for k in keys if a.initializers.get(k) != b.initializers.get(k))
        problems.append(
            f"initializers differ, first at {first}: {a.initializers.get(first)} vs {b.initializers.get(first)}"
        )
    if a.opsets != b.opsets:
        problems.append(f"opsets differ: {a.opsets} vs {b.opsets}")
    if a.moe_layers != b.moe_layers:
        problems.append(f"{a.moe_layers} MoE layers vs {b.moe_layers}")
    files_a = {p.name for p in ours_llm.iterdir() if p.name != MODEL + ".data"}
    files_b = {p.name for p in vanilla_llm.iterdir() if p.name != MODEL + ".data"}
    if files_a != files_b:
        problems.append(f"files differ: {sorted(files_a ^ files_b)}")
    if json.loads((ours_llm / "config.json").read_text()) != json.loads((vanilla_llm / "config.json").read_text()):
        problems.append("config.json differs")
    for name in SAME_FILES:
        if (vanilla_llm / name).is_file() and (
            not (ours_llm / name).is_file() or (ours_llm / name).read_bytes() != (vanilla_llm / name).read_bytes()
        ):
            problems.append(f"{name} differs")
    return problems


def deamoe_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if (n.op_type, n.domain) == (contract.OP_TYPE, contract.DOMAIN)]


def cut_out(model: onnx.ModelProto, node: onnx.NodeProto) -> onnx.ModelProto:
    """node as a model of its own: hidden states [T, d] in (the node's dtype), its output out,
    its weight inputs as initializers."""
    initializers = {t.name: t for t in model.graph.initializer}
    config = plugin_node.config_from_node(node)
    weights = [initializers[name] for name in node.input[1:]]
    dtype = onnx.TensorProto.FLOAT16
    graph = helper.make_graph(
        [node],
        f"{node.name}_alone",
        [helper.make_tensor_value_info(node.input[0], dtype, ["tokens", config.hidden_size])],
        [helper.make_tensor_value_info(node.output[0], dtype, ["tokens", config.hidden_size])],
        weights,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(contract.DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets)


@dataclass
class NodeCheck:
    layer: int
    node: str
    weights_match: bool
    max_abs_error: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.weights_match and self.max_abs_error <= self.tolerance


def node_checks(ours: str | Path, lm_dir: str | Path, *, tokens: int = 16, seed: int = 0) -> list[NodeCheck]:
    """Each DeaMoE node of the export at ours against the LM at lm_dir (see the module docstring)."""
    from ... import runtimes
    from ...lm.checkpoint import load_lm
    from ...runtimes.base import Prepared, as_numpy
    from ...runtimes.onnxruntime import make_session
    from ...validation.pair import compare_layers
    from .tensors import node_tensors

    model = onnx.load(Path(ours) / LLM / MODEL)
    lm = load_lm(lm_dir).model
    moe_blocks = [i for i, block in enumerate(lm.layers) if block.is_moe]
    nodes = deamoe_nodes(model)
    if len(nodes) != len(moe_blocks):
        raise AssertionError(f"{len(nodes)} DeaMoE nodes for {len(moe_blocks)} MoE blocks")
    initializers = {t.name: t for t in model.graph.initializer}
    checks = []
    gen = torch.Generator().manual_seed(seed)
    for index, node in zip(moe_blocks, nodes, strict=True):
        layer = lm.layers[index].mlp
        expected = node_tensors(layer)
        stored = [numpy_helper.to_array(initializers[name]) for name in node.input[1:]]
        weights_match = len(stored) == len(expected) and all(
            s.dtype == e.numpy().dtype and s.shape == tuple(e.shape) and np.array_equal(s, e.numpy())
            for s, e in zip(stored, expected.values(), strict=True)
        )
        x = (torch.randn(tokens, layer.config.hidden_size, generator=gen) * 0.5).half()
        reference = runtimes.get("torch").prepare(layer.to(torch.float16))
        tolerance = 2e-3 * max(1.0, float(reference(x).float().abs().max()))
        session = make_session(cut_out(model, node))
        run = partial(_run_node, session, node.input[0])
        alone = Prepared("ort", run, to_input=as_numpy, to_torch=torch.from_numpy)
        (row,) = compare_layers(alone, reference, [x], atol=tolerance, rtol=0.0)
        checks.append(NodeCheck(index, node.name, weights_match, row.max_abs, tolerance))
    return checks


def _run_node(session, name: str, x: np.ndarray) -> np.ndarray:
    return session.run(None, {name: x})[0]
