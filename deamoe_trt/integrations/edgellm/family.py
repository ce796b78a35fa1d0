"""The DeaMoE family inside TensorRT Edge-LLM's exporter: a Qwen3-MoE model whose MoE blocks are our node.

Runs in the Python that has Edge-LLM (its own venv; see deamoe_trt.integrations.edgellm), never
in deamoe-trt's: it imports tensorrt_edgellm, onnx and onnxscript at the versions Edge-LLM pins.

What it adds to Edge-LLM, through its extension points only:
- `torch.ops.deamoe_trt.edgellm_moe`, a torch.library custom op: token-major hidden states
  [T, d] in, [T, d] out, the layer's weights as a list of tensors and its node attributes
  as a JSON string. Its eager kernel is the PyTorch reference (deamoe_trt.layer);
- its ONNX translation, added to the table Edge-LLM hands torch.onnx: one
  `deamoe_trt::DeaMoE` node per MoE layer, inputs and attributes in contract order
  (deamoe_trt.contract via export.plugin_node), with an ONNX schema registered for it as
  Edge-LLM registers one for each of its plugins;
- `family_class(layers)`: Edge-LLM's Qwen3MoeCausalLM with each MoE block replaced by a
  DeaMoEBlock holding that layer's tensors as buffers (so torch.export lifts them into
  initializers named "<module path>.<canonical name>"). Attention, norms, dense MLPs,
  embedding split, KV layout, the runtime config and tokenizer files stay Edge-LLM's own.
"""

from __future__ import annotations

import functools
import json
from contextlib import contextmanager

import onnx
import onnxscript
import torch
from onnx.defs import OpSchema
from torch import nn

from ... import contract
from ...export import plugin_node
from ...layer import DeaMoELayer
from .tensors import layer_from_node, node_tensors

OP_NAMESPACE = "deamoe_trt"
OP_NAME = "edgellm_moe"
# Initializers whose names contain this keep float32 (Edge-LLM narrows the others to fp16):
# the router keeps its precision (spec, "Router precision").
ROUTER_PATTERN = ".mlp.router."

_ONNX_ATTRIBUTE = {"int": OpSchema.AttrType.INT, "bool": OpSchema.AttrType.INT}
_ONNX_ATTRIBUTE |= {"float": OpSchema.AttrType.FLOAT, "str": OpSchema.AttrType.STRING}


@torch.library.custom_op(f"{OP_NAMESPACE}::{OP_NAME}", mutates_args=())
def edgellm_moe(hidden_states: torch.Tensor, weights: list[torch.Tensor], attributes: str) -> torch.Tensor:
    """The DeaMoE layer's output for hidden_states [T, d] (the reference, in the input's dtype)."""
    layer = layer_from_node(weights, json.loads(attributes), hidden_states.dtype)
    with torch.no_grad():
        x = hidden_states.to(layer.dtype)
        return layer.forward_routed(x, layer.route(x)).to(hidden_states.dtype)


@edgellm_moe.register_fake
def _(hidden_states: torch.Tensor, weights: list[torch.Tensor], attributes: str) -> torch.Tensor:
    return torch.empty_like(hidden_states)


class DeaMoEBlock(nn.Module):
    """One MoE block of the model: the layer's node tensors as buffers under their canonical
    names (submodules for the dotted parts), forwarded to the custom op."""

    def __init__(self, layer: DeaMoELayer):
        super().__init__()
        self.keys = list(plugin_node.state_keys(layer.config, layer.quant))
        self.attributes = json.dumps(plugin_node.config_to_attributes(layer.config, layer.quant), sort_keys=True)
        for key, tensor in node_tensors(layer).items():
            *path, name = key.split(".")
            owner: nn.Module = self
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, nn.Module())
                owner = getattr(owner, part)
            owner.register_buffer(name, tensor)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # Edge-LLM's graph is token-major: hidden_states is already [T, d].
        return edgellm_moe(hidden_states, [self.get_buffer(k) for k in self.keys], self.attributes)


def _schema() -> OpSchema:
    """deamoe_trt::DeaMoE as ONNX sees it: variadic inputs in contract order, the contract's attributes."""
    attributes = [
        OpSchema.Attribute(a.name, _ONNX_ATTRIBUTE[a.kind], a.meaning, required=a.required) for a in contract.ATTRIBUTES
    ]
    attributes += [
        OpSchema.Attribute(name, OpSchema.AttrType.STRING, "plugin selector") for name in contract.SELECTOR_ATTRIBUTES
    ]
    return OpSchema(
        contract.OP_TYPE,
        contract.DOMAIN,
        1,
        doc="The DeaMoE layer (deamoe_trt/contract.py, plugins/deamoe/README.md).",
        inputs=[
            OpSchema.FormalParameter(
                "inputs",
                "T",
                "hidden_states then the present weight inputs, in contract order",
                param_option=OpSchema.FormalParameterOption.Variadic,
                is_homogeneous=False,
            )
        ],
        outputs=[OpSchema.FormalParameter(contract.OUTPUT_NAME, "T", "[T, d], the hidden states' dtype")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)", "tensor(int32)"], "")],
        attributes=attributes,
    )


@functools.cache
def register_schema() -> None:
    if not onnx.defs.has(contract.OP_TYPE, contract.DOMAIN):
        onnx.defs.register_schema(_schema())


def _translation(hidden_states, weights, attributes: str):
    """torch.ops.deamoe_trt.edgellm_moe -> one deamoe_trt::DeaMoE node (traced by torch.onnx)."""
    register_schema()
    opset = onnxscript.values.Opset(contract.DOMAIN, 1)
    return opset.DeaMoE(hidden_states, *weights, **json.loads(attributes))


def translation_table(base: dict) -> dict:
    """Edge-LLM's custom translation table with our op added."""
    return {**base, torch.ops.deamoe_trt.edgellm_moe.default: _translation}


@contextmanager
def installed(layers: dict[int, DeaMoELayer]):
    """Edge-LLM's exporter with the DeaMoE family: "qwen3_moe" checkpoints build family_class(layers),
    and the ONNX export translates our op. Undone on exit."""
    import tensorrt_edgellm
    from tensorrt_edgellm import model as edgellm_model
    from tensorrt_edgellm.onnx import export as edgellm_export

    register_schema()
    registry = edgellm_model._MODEL_REGISTRY
    previous_class, previous_table = registry["qwen3_moe"], edgellm_export.build_custom_translation_table
    tensorrt_edgellm.register_model("qwen3_moe", family_class(layers), edgellm_model.standard_attention_scale)
    edgellm_export.build_custom_translation_table = lambda: translation_table(previous_table())
    try:
        yield
    finally:
        tensorrt_edgellm.register_model("qwen3_moe", previous_class, edgellm_model.standard_attention_scale)
        edgellm_export.build_custom_translation_table = previous_table


def family_class(layers: dict[int, DeaMoELayer]) -> type:
    """Edge-LLM's Qwen3MoeCausalLM whose MoE block i is DeaMoEBlock(layers[i])."""
    from tensorrt_edgellm.models.qwen3_moe import modeling_qwen3_moe as qwen3

    class DeaMoEQwen3MoeCausalLM(qwen3.Qwen3MoeCausalLM):
        preserve_fp32_initializer_patterns = (ROUTER_PATTERN,)

        def __init__(self, config) -> None:
            # Edge-LLM builds each MoE block by the module-level name; it builds ours
            # instead while this model is made (and no expert tensors are allocated).
            original = qwen3.Qwen3SparseMoeBlock

            def block(config, module_prefix: str = "") -> nn.Module:
                index = int(module_prefix.split(".")[1])
                if index not in layers:
                    raise ValueError(f"layer {index} is a MoE layer in config.json but the DeaMoE LM has none there")
                return DeaMoEBlock(layers[index])

            qwen3.Qwen3SparseMoeBlock = block
            try:
                super().__init__(config)
            finally:
                qwen3.Qwen3SparseMoeBlock = original

    return DeaMoEQwen3MoeCausalLM
