"""A small builder for ONNX graphs: the one place export code makes nodes, values and weights.

`GraphBuilder` holds one graph under construction. Every form of the DeaMoE layer is written
against it (see `deamoe_trt.export.emit_layer`), and so can any larger graph that wants
DeaMoE layers inside it, such as a whole decoder:

    from deamoe_trt.export import GraphBuilder, emit_layer

    b = GraphBuilder(opset=17, dtype="fp16")
    x = b.add_input("hidden_states", ["T", d])       # element type: b.dtype unless given
    h = b.op("Mul", [x, b.const([2.0], b.dtype.onnx)])  # any ONNX op; returns the output name
    y = emit_layer(b, h, layer, "ort", prefix="model.layers.0.mlp.")
    b.add_output(y, ["T", d], name="output")
    model = b.build("decoder", metadata={"producer": "me"})  # an onnx.ModelProto

What it does for you:
- Names: `op` names its outputs and nodes uniquely (under the current `scope`), so callers
  never invent value names; `name(hint)` gives a fresh one when a caller needs it up front.
- Weights: `weight(name, tensor)` stores a torch tensor as an initializer in the builder's
  dtype under exactly the name given (duplicates are an error: two layers sharing a prefix
  is a bug). `const` stores small constants once per distinct value.
- Opset differences: `reduce`, `unsqueeze`, `squeeze` and `slice` pick attribute or input
  forms by opset, so emitting code does not branch on it.
- Domains: every domain an `op` uses is imported in the built model (opset 1 for custom
  domains unless `domain_versions` says otherwise).
- Subgraphs: `subgraph()` returns a builder for an If/Loop body that shares names and
  initializers with its parent; `body.graph(name, outputs)` turns it into a GraphProto.

Element types are ONNX `TensorProto` enums; `b.dtype.onnx` is the activation type.
Shapes are lists of ints, strings (symbolic dims) or None.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

from ..errors import UsageError
from .dtypes import DTYPES, ExportDtype, get_dtype, to_numpy

if TYPE_CHECKING:
    from .save import ExternalData

# 17: the lowest opset with everything the forms and a decoder around them need (e.g.
# LayerNormalization), and one TensorRT 10 and every ONNX Runtime since 1.13 read.
DEFAULT_OPSET = 17
MIN_OPSET = 17
MAX_OPSET = onnx.defs.onnx_opset_version()

# Versions of the non-standard domains the forms use.
CUSTOM_DOMAIN_VERSIONS = {"com.microsoft": 1}


def check_opset(opset: int | None) -> int:
    if opset is None:
        return DEFAULT_OPSET
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise UsageError(f"opset must be an integer from {MIN_OPSET} to {MAX_OPSET}, got {opset!r}")
    return opset


class GraphBuilder:
    """One ONNX graph under construction; see the module docstring for a walk-through."""

    def __init__(
        self,
        opset: int | None = None,
        dtype: str | ExportDtype = "fp32",
        *,
        external: ExternalData | None = None,
        _parent: GraphBuilder | None = None,
    ):
        """external: where each initializer's bytes go as it is stored (save.save_model_streamed),
        so the builder never holds the weights; None: they stay in the graph."""
        self.opset = check_opset(opset)
        self.dtype = dtype if isinstance(dtype, ExportDtype) else get_dtype(dtype)
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._parent = _parent
        if _parent is None:
            self.initializers: dict[str, TensorProto] = {}
            self.domains: dict[str, int] = {"": self.opset}
            self._used_names: set[str] = set()
            self._next_suffix: dict[str, int] = {}
            self._consts: dict[tuple, str] = {}
            self._scope: list[str] = []
            self.external = external
        else:
            # A subgraph shares its root's names, weights and domains: outer-scope initializers
            # are visible inside If/Loop bodies, and names must be unique across all of them.
            root = _parent._root
            self.initializers, self.domains = root.initializers, root.domains
            self._used_names, self._consts, self._scope = root._used_names, root._consts, root._scope
            self._next_suffix = root._next_suffix
            self.external = root.external

    @property
    def _root(self) -> GraphBuilder:
        return self if self._parent is None else self._parent._root

    # Names --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def scope(self, prefix: str) -> Iterator[None]:
        """Prefix generated value and node names with prefix while inside the block."""
        self._scope.append(prefix)
        try:
            yield
        finally:
            self._scope.pop()

    def name(self, hint: str) -> str:
        """A value name not used yet, built from the current scope and hint."""
        base = "".join(self._scope) + hint
        candidate, n = base, self._next_suffix.get(base, 0)
        while candidate in self._used_names:
            n += 1
            candidate = f"{base}_{n}"
        self._next_suffix[base] = n  # the next call with this base starts here, not at 0
        self._used_names.add(candidate)
        return candidate

    def _claim(self, name: str, what: str) -> str:
        if name in self._used_names:
            raise UsageError(f"{what} name {name!r} is already used in this graph")
        self._used_names.add(name)
        return name

    # Graph inputs, outputs, weights ---------------------------------------------------------

    def add_input(self, name: str, shape: Sequence[int | str | None], elem_type: int | None = None) -> str:
        self._claim(name, "input")
        self.inputs.append(helper.make_tensor_value_info(name, _elem(elem_type, self), list(shape)))
        return name

    def add_output(
        self,
        value: str,
        shape: Sequence[int | str | None] | None,
        elem_type: int | None = None,
        *,
        name: str | None = None,
    ) -> str:
        """Declare value a graph output, renamed to name if given.

        A value only its producing node knows is renamed in place; anything else (a graph
        input, a value other nodes read) goes out through an Identity."""
        if name is not None and name != value:
            self._claim(name, "output")
            producer = next((n for n in self.nodes if value in n.output), None)
            read_elsewhere = any(value in _reads(n) for n in self.nodes) or any(i.name == value for i in self.inputs)
            if producer is not None and not read_elsewhere:
                producer.output[list(producer.output).index(value)] = name
            else:
                self.nodes.append(helper.make_node("Identity", [value], [name], name=self.name("output_identity")))
            value = name
        self.outputs.append(
            helper.make_tensor_value_info(value, _elem(elem_type, self), None if shape is None else list(shape))
        )
        return value

    def weight(
        self,
        name: str,
        tensor: torch.Tensor,
        dtype: str | ExportDtype | None = None,
        shape: Sequence[int] | None = None,
    ) -> str:
        """Store tensor as an initializer called name, cast to dtype (default: the builder's).

        shape: the initializer's dims when they differ from the tensor's (a strided view
        whose C-order elements are the stored tensor's, e.g. [G, f, 2, d] stored as [G, 2f, d])."""
        export_dtype = self.dtype if dtype is None else get_dtype(dtype)
        return self.add_initializer(name, to_numpy(tensor, export_dtype), export_dtype.onnx, shape)

    def add_initializer(self, name: str, array: np.ndarray, elem_type: int, shape: Sequence[int] | None = None) -> str:
        """Store array (already of elem_type's numpy type; uint16 bits for bf16) as initializer name."""
        elements = int(np.prod(shape)) if shape is not None else array.size
        if elem_type in (TensorProto.UINT4, TensorProto.INT4):  # two per byte, low nibble first
            elements = (elements + 1) // 2
        if shape is not None and elements != array.size:
            raise ValueError(f"initializer {name}: shape {list(shape)} does not hold {array.size} elements")
        return self._store(self._claim(name, "initializer"), array, elem_type, shape)

    def _store(self, name: str, array: np.ndarray, elem_type: int, shape: Sequence[int] | None = None) -> str:
        proto = TensorProto(name=name, data_type=elem_type, dims=list(array.shape if shape is None else shape))
        raw = array.tobytes()  # C order whatever the strides: one copy
        if self.external is not None:
            self.external.add(proto, raw)
        else:
            proto.raw_data = raw
        self.initializers[name] = proto
        return name

    def const(self, values: Any, elem_type: int, shape: Sequence[int] | None = None) -> str:
        """A small constant tensor (stored once per distinct value, type and shape)."""
        numpy_type = helper.tensor_dtype_to_np_dtype(elem_type)
        array = np.asarray(values, dtype=numpy_type)
        if shape is not None:
            array = array.reshape(shape)
        key = (elem_type, array.shape, array.tobytes())
        if key not in self._consts:
            name = self.name(f"const_{helper.tensor_dtype_to_string(elem_type).split('.')[-1].lower()}")
            self._consts[key] = self._store(name, array, elem_type)
        return self._consts[key]

    def i64(self, *values: int) -> str:
        """A 1-D int64 constant: shapes, axes, starts and ends."""
        return self.const(list(values), TensorProto.INT64)

    def scalar(self, value: float, elem_type: int = TensorProto.FLOAT) -> str:
        return self.const(value, elem_type, shape=())

    # Nodes --------------------------------------------------------------------------------------

    def op(
        self,
        op_type: str,
        inputs: Sequence[str],
        *,
        outputs: int | Sequence[str] = 1,
        domain: str = "",
        name: str | None = None,
        **attrs: Any,
    ) -> Any:
        """Append one node; returns its output name, or a list of them when outputs != 1.

        outputs: how many outputs to name automatically, or the exact names to use.
        Attributes whose value is None are left out (the op's default applies).
        """
        if isinstance(outputs, int):
            out_names = [self.name(f"{op_type}_out" if outputs == 1 else f"{op_type}_out{i}") for i in range(outputs)]
        else:
            out_names = [self._claim(o, "output") for o in outputs]
        if domain and domain not in self.domains:
            self.domains[domain] = CUSTOM_DOMAIN_VERSIONS.get(domain, 1)
        node_name = self.name(name or op_type)
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(helper.make_node(op_type, list(inputs), out_names, name=node_name, domain=domain, **attrs))
        return out_names[0] if outputs == 1 else out_names

    def cast(self, x: str, elem_type: int) -> str:
        return self.op("Cast", [x], to=elem_type)

    def reduce(self, op_type: str, x: str, axes: Sequence[int], keepdims: bool = False) -> str:
        """ReduceSum/ReduceMax/...: axes became an input in opset 13 (Sum) and 18 (the others)."""
        axes_as_input = self.opset >= (13 if op_type == "ReduceSum" else 18)
        if axes_as_input:
            return self.op(op_type, [x, self.i64(*axes)], keepdims=int(keepdims))
        return self.op(op_type, [x], axes=list(axes), keepdims=int(keepdims))

    def unsqueeze(self, x: str, axes: Sequence[int]) -> str:
        return self.op("Unsqueeze", [x, self.i64(*axes)])

    def squeeze(self, x: str, axes: Sequence[int]) -> str:
        return self.op("Squeeze", [x, self.i64(*axes)])

    def slice(self, x: str, axis: int, start: int, end: int) -> str:
        return self.op("Slice", [x, self.i64(start), self.i64(end), self.i64(axis)])

    def reshape(self, x: str, shape: Sequence[int]) -> str:
        return self.op("Reshape", [x, self.i64(*shape)])

    # Subgraphs and the model -------------------------------------------------------------------

    def subgraph(self) -> GraphBuilder:
        """A builder for an If/Loop body: shares names and initializers with this one."""
        return GraphBuilder(self.opset, self.dtype, _parent=self)

    def graph(self, name: str, outputs: Sequence[tuple[str, int]] = ()) -> onnx.GraphProto:
        """This builder's nodes as a GraphProto; outputs = (value, element type) pairs for a subgraph.

        A subgraph holds no initializers of its own: they live in the root graph."""
        declared = self.outputs + [helper.make_tensor_value_info(v, t, None) for v, t in outputs]
        initializers = list(self.initializers.values()) if self._parent is None else []
        return helper.make_graph(self.nodes, name, self.inputs, declared, initializer=initializers)

    def build(self, name: str, *, metadata: dict[str, str] | None = None, doc: str = "") -> onnx.ModelProto:
        """The finished model: graph, opset imports for every domain used, metadata_props."""
        if self._parent is not None:
            raise RuntimeError("build() is for the root builder; call graph() on a subgraph")
        opsets = [helper.make_opsetid(domain, version) for domain, version in self.domains.items()]
        model = helper.make_model(
            self.graph(name),
            opset_imports=opsets,
            producer_name="deamoe-trt",
            # The lowest IR version the opset allows: readable by the oldest runtimes that know the opset.
            ir_version=helper.find_min_ir_version_for([helper.make_opsetid("", self.opset)], ignore_unknown=True),
            doc_string=doc,
        )
        for key, value in (metadata or {}).items():
            model.metadata_props.add(key=key, value=value)
        return model


def _reads(node: onnx.NodeProto) -> set[str]:
    """Every value node reads, including those its If/Loop bodies read from outer scope."""
    names = set(node.input)
    for attr in node.attribute:
        for graph in [attr.g] if attr.HasField("g") else list(attr.graphs):
            for inner in graph.node:
                names |= _reads(inner)
    return names


def _elem(elem_type: int | None, builder: GraphBuilder) -> int:
    return builder.dtype.onnx if elem_type is None else elem_type


__all__ = ["DEFAULT_OPSET", "DTYPES", "MAX_OPSET", "MIN_OPSET", "GraphBuilder", "check_opset"]
