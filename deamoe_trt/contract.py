"""The DeaMoE plugin node's contract, declared once: identity, attributes, inputs, enum codes.

Every other statement of the contract is generated from these tables or checked against
them by tests/test_contract.py (no TensorRT needed):
- generated: export/plugin_node.py (attribute types, input presence), trt/qdp.py (the
  QDP's tables and input dtypes), cuda/_abi.py (LayerParams, LayerWeights, enum codes) and
  the tables of plugins/deamoe/README.md (`python -m deamoe_trt.contract --write-readme`);
- checked textually: plugins/deamoe/'s deamoePlugin.h/.cpp and deamoePluginFields.h/.cpp
  (identity, field table, parsing, serialisation, input roles, presence, shapes, weight
  pointers, a quantized node's codes type, packing and allowed bits/group sizes),
  native/cuda/'s deamoeKernels.h (enums, LayerParams, LayerWeights, the C ABI) and
  deamoeRouting.cuh/deamoePlan.cuh against the host-test bindings,
  tests/plugins/deamoe/plugin_harness.cpp, and the QDP's hand-written signatures.

A quantized node (docs/quantization.md) is the same node with two more attributes, whose
values come from the checkpoint's QuantConfig (Attribute.source), its FFN weight inputs
carrying packed codes and six scale inputs appended (Input.quantized); functions that
depend on it take `quant` (a QuantConfig, None for float weights).

A leaf module: plain data, no torch or onnx, so anything may import it.
"""

# ruff: noqa: E501  (the INPUTS table reads best one row per input)
from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OP_TYPE = "DeaMoE"  # ONNX op_type = TensorRT plugin name
DOMAIN = "deamoe_trt"
PLUGIN_VERSION = "1"
PLUGIN_NAMESPACE = ""
OUTPUT_NAME = "output"

# Node attributes that select the plugin rather than configure it (not plugin fields).
SELECTOR_ATTRIBUTES = {"plugin_version": PLUGIN_VERSION, "plugin_namespace": PLUGIN_NAMESPACE}


# Where an attribute's value comes from: the DeaMoEConfig field of the attribute's name, or
# (QUANTIZATION + "." + name) that attribute of the checkpoint's QuantConfig
# (deamoe_trt/quant.py, config.json's "quantization"), 0 for a float checkpoint.
CONFIG = "config"
QUANTIZATION = "quantization"


@dataclass(frozen=True)
class Attribute:
    """One node attribute = one plugin field = one LayerParams member, and one DeaMoEConfig
    field or QuantConfig attribute (source)."""

    name: str
    kind: str  # "int", "bool" (travels as INT 0/1), "float" or "str"
    required: bool  # the plugin refuses a node without it; optional ones default as DeaMoEConfig (0 if quantization)
    param: str  # deamoe::LayerParams member
    symbol: str  # the spec's symbol, used in shapes ("" when it has none)
    meaning: str  # README's description
    source: str = CONFIG  # CONFIG, or "quantization.<QuantConfig attribute>"


ATTRIBUTES: tuple[Attribute, ...] = (
    Attribute("hidden_size", "int", True, "hidden", "d", "d"),
    Attribute("num_departments", "int", True, "numDepartments", "D", "D"),
    Attribute("experts_per_department", "int", True, "expertsPerDepartment", "m", "m"),
    Attribute("shared_intermediate_size", "int", True, "sharedWidth", "f_s", "f_s"),
    Attribute("private_intermediate_size", "int", True, "privateWidth", "f_p", "f_p"),
    Attribute("top_k", "int", True, "topK", "k", "k"),
    Attribute("top_departments", "int", True, "topDepartments", "g", "g"),
    Attribute("score_func", "str", False, "scoreFunc", "", "`softmax` or `sigmoid`"),
    Attribute("department_score", "str", False, "departmentScore", "", "`max`, `sum_top2` or `sum`"),
    Attribute("norm_topk_prob", "bool", False, "normTopkProb", "", "0 or 1"),
    Attribute("routed_scaling_factor", "float", False, "routedScalingFactor", "", "scale on the routing weights"),
    Attribute("router_bias", "bool", False, "hasRouterBias", "", "0 or 1: input 2 present"),
    Attribute("shared_expert_intermediate_size", "int", False, "sharedExpertWidth", "f_sh", "f_sh, 0 = none"),
    Attribute("shared_expert_gate", "bool", False, "sharedExpertGate", "", "0 or 1: input 9 present"),
    # gpt-oss's extensions (spec, "Extensions (third wave)"): optional, so nodes and engines
    # written before them read as the layer without them.
    Attribute("ffn_bias", "bool", False, "ffnBias", "", "0 or 1: the FFN biases (inputs 17-21) present"),
    Attribute("activation", "str", False, "activation", "", "`swiglu` or `swiglu_clamped`"),
    Attribute("swiglu_alpha", "float", False, "swigluAlpha", "", "alpha of `swiglu_clamped`"),
    Attribute("swiglu_limit", "float", False, "swigluLimit", "", "limit of `swiglu_clamped`"),
    Attribute("router_logit_bias", "bool", False, "hasRouterLogitBias", "", "0 or 1: input 16 present"),
    # Quantized checkpoints (docs/quantization.md): both 0 for float weights, so nodes and
    # engines written before these attributes existed read as float.
    Attribute(
        "weight_bits",
        "int",
        False,
        "weightBits",
        "bits",
        "0: float FFN weights; 4 or 8: inputs 3-8 are packed codes",
        f"{QUANTIZATION}.bits",
    ),
    Attribute(
        "weight_group_size",
        "int",
        False,
        "weightGroupSize",
        "G",
        "input columns per scale: 16, 32, 64 or 128; 0 when weight_bits = 0",
        f"{QUANTIZATION}.group_size",
    ),
)
ATTRIBUTE_NAMES = tuple(a.name for a in ATTRIBUTES)
CONFIG_ATTRIBUTES = tuple(a for a in ATTRIBUTES if a.source == CONFIG)  # = DeaMoEConfig's fields, in order
QUANT_ATTRIBUTES = tuple(a for a in ATTRIBUTES if a.source != CONFIG)
WEIGHT_BITS = "weight_bits"
WEIGHT_GROUP_SIZE = "weight_group_size"
BITS = (4, 8)  # weight_bits of a quantized node (0: float)
GROUP_SIZES = (16, 32, 64, 128)  # its weight_group_size

# The values of the string attributes; each one's position is its code in deamoeKernels.h
# (enum ScoreFunc / DepartmentScore / Activation, C enumerator "k" + NAME.upper()).
ENUMS: dict[str, tuple[str, ...]] = {
    "score_func": ("softmax", "sigmoid"),
    "department_score": ("max", "sum_top2", "sum"),
    "activation": ("swiglu", "swiglu_clamped"),
}
ENUM_TYPES = {"score_func": "ScoreFunc", "department_score": "DepartmentScore", "activation": "Activation"}

# An input's dtype: the node's activation dtype (float32/float16/bfloat16, chosen by
# hidden_states); always float32 whatever the activation dtype; or either of the two, the
# kernels told which by the input's dtype_param (a LayerParams member, 1 for float32).
ACTIVATION = "activation"
FLOAT32 = "float32"
FLOAT32_OR_ACTIVATION = "float32 or activation"
# A quantized node's FFN weight inputs carry the checkpoint's packed codes (uint8 bytes, int4
# two per byte) as int32 words, 4 bytes each, little-endian: the same bytes, in a type every
# TensorRT plugin input and ONNX-parsed constant takes (docs/design.md, "Quantized plugin
# node"). A codes input's last dim is cols * bits / CODE_WORD_BITS.
CODES_DTYPE = "int32"
CODE_WORD_BITS = 32

# The attribute that, set, adds the FFN biases to the inputs of the parts present (Input.also_when).
FFN_BIAS = "ffn_bias"

# Input.quantized: what an input is in a quantized node (weight_bits > 0).
CODES = "codes"  # an FFN weight: its packed codes instead, dtype CODES_DTYPE, last dim packed
SCALES = "scales"  # present only in a quantized node: one scale per (row, group of G columns)


@dataclass(frozen=True)
class Input:
    """One node input, in contract order; absent optional inputs are dropped, not left empty."""

    name: str  # ONNX input role = DeaMoELayer state_dict key
    qdp_arg: str  # parameter name in the QDP's signatures (trt/qdp.py)
    role: str  # deamoe::plugin::InputRole enumerator
    weights_field: str  # deamoe::LayerWeights member ("" for hidden_states)
    shape: tuple[str, ...]  # symbols of ATTRIBUTES, N = D*m, T = tokens, 2*x
    present_when: str  # attribute that must be non-zero for the input to be present ("" = always)
    dtype: str = ACTIVATION
    dtype_param: str = ""  # FLOAT32_OR_ACTIVATION: the LayerParams member saying which
    quantized: str = ""  # CODES or SCALES (see above); "" = the same in a quantized node
    also_when: str = ""  # a second attribute that must be non-zero too (FFN_BIAS for the FFN biases)


# One row per input, aligned as a table (wider than the line limit on purpose).
# fmt: off
INPUTS: tuple[Input, ...] = (
    #     name                      QDP argument      InputRole              LayerWeights        shape                present when
    Input("hidden_states",          "hidden_states",  "kHIDDEN",             "",                 ("T", "d"),          ""),
    Input("router.weight",          "router_w",       "kROUTER_WEIGHT",      "routerWeight",     ("N", "d"),          "",            FLOAT32_OR_ACTIVATION, "routerWeightFloat32"),
    Input("router.bias",            "router_b",       "kROUTER_BIAS",        "routerBias",       ("N",),              "router_bias", FLOAT32),
    Input("departments.gate_up",    "dept_gate_up",   "kDEPARTMENT_GATE_UP", "departmentGateUp", ("D", "2*f_s", "d"), "shared_intermediate_size",        quantized=CODES),
    Input("departments.down",       "dept_down",      "kDEPARTMENT_DOWN",    "departmentDown",   ("D", "d", "f_s"),   "shared_intermediate_size",        quantized=CODES),
    Input("experts.gate_up",        "expert_gate_up", "kEXPERT_GATE_UP",     "expertGateUp",     ("N", "2*f_p", "d"), "private_intermediate_size",       quantized=CODES),
    Input("experts.down",           "expert_down",    "kEXPERT_DOWN",        "expertDown",       ("N", "d", "f_p"),   "private_intermediate_size",       quantized=CODES),
    Input("shared_experts.gate_up", "shared_gate_up", "kSHARED_GATE_UP",     "sharedGateUp",     ("2*f_sh", "d"),     "shared_expert_intermediate_size", quantized=CODES),
    Input("shared_experts.down",    "shared_down",    "kSHARED_DOWN",        "sharedDown",       ("d", "f_sh"),       "shared_expert_intermediate_size", quantized=CODES),
    Input("shared_experts.gate",    "shared_gate",    "kSHARED_GATE",        "sharedGate",       ("1", "d"),          "shared_expert_gate"),
    # Appended so that float nodes keep their inputs; present when their part is and weight_bits > 0.
    Input("departments.gate_up.scales",    "dept_gate_up_scales",   "kDEPARTMENT_GATE_UP_SCALES", "departmentGateUpScales", ("D", "2*f_s", "d/G"), "shared_intermediate_size",        quantized=SCALES),
    Input("departments.down.scales",       "dept_down_scales",      "kDEPARTMENT_DOWN_SCALES",    "departmentDownScales",   ("D", "d", "f_s/G"),   "shared_intermediate_size",        quantized=SCALES),
    Input("experts.gate_up.scales",        "expert_gate_up_scales", "kEXPERT_GATE_UP_SCALES",     "expertGateUpScales",     ("N", "2*f_p", "d/G"), "private_intermediate_size",       quantized=SCALES),
    Input("experts.down.scales",           "expert_down_scales",    "kEXPERT_DOWN_SCALES",        "expertDownScales",       ("N", "d", "f_p/G"),   "private_intermediate_size",       quantized=SCALES),
    Input("shared_experts.gate_up.scales", "shared_gate_up_scales", "kSHARED_GATE_UP_SCALES",     "sharedGateUpScales",     ("2*f_sh", "d/G"),     "shared_expert_intermediate_size", quantized=SCALES),
    Input("shared_experts.down.scales",    "shared_down_scales",    "kSHARED_DOWN_SCALES",        "sharedDownScales",       ("d", "f_sh/G"),       "shared_expert_intermediate_size", quantized=SCALES),
    # Appended so that earlier nodes keep their inputs: the logit bias, then the FFN biases
    # (present when their part is and ffn_bias; never quantized: the node's activation dtype).
    Input("router.logit_bias",           "router_logit_b",      "kROUTER_LOGIT_BIAS",       "routerLogitBias",      ("N",),          "router_logit_bias",               FLOAT32),
    Input("departments.gate_up_bias",    "dept_gate_up_bias",   "kDEPARTMENT_GATE_UP_BIAS", "departmentGateUpBias", ("D", "2*f_s"),  "shared_intermediate_size",        also_when=FFN_BIAS),
    Input("experts.gate_up_bias",        "expert_gate_up_bias", "kEXPERT_GATE_UP_BIAS",     "expertGateUpBias",     ("N", "2*f_p"),  "private_intermediate_size",       also_when=FFN_BIAS),
    Input("experts.down_bias",           "expert_down_bias",    "kEXPERT_DOWN_BIAS",        "expertDownBias",       ("N", "d"),      "private_intermediate_size",       also_when=FFN_BIAS),
    Input("shared_experts.gate_up_bias", "shared_gate_up_bias", "kSHARED_GATE_UP_BIAS",     "sharedGateUpBias",     ("2*f_sh",),     "shared_expert_intermediate_size", also_when=FFN_BIAS),
    Input("shared_experts.down_bias",    "shared_down_bias",    "kSHARED_DOWN_BIAS",        "sharedDownBias",       ("d",),          "shared_expert_intermediate_size", also_when=FFN_BIAS),
)
# fmt: on
WEIGHT_INPUTS = INPUTS[1:]
MAX_INPUTS = len(INPUTS)
# LayerParams = one member per attribute, then these (set from the inputs' dtypes, not from
# attributes), in input order.
DTYPE_PARAMS = tuple(i.dtype_param for i in INPUTS if i.dtype_param)
assert all((i.dtype == FLOAT32_OR_ACTIVATION) == bool(i.dtype_param) for i in INPUTS), "dtype_param iff either dtype"


# `config` below is a DeaMoEConfig and `quant` the checkpoint's QuantConfig or None (float);
# both are read by attribute name only, so this module needs neither.


def attribute_value(attribute: Attribute, config: Any, quant: Any = None) -> Any:
    """The value a node of config (and quant) gives attribute."""
    if attribute.source == CONFIG:
        return getattr(config, attribute.name)
    _, _, field = attribute.source.partition(".")
    return 0 if quant is None else getattr(quant, field)


def attribute_values(config: Any, quant: Any = None) -> dict[str, Any]:
    """Every attribute's value for a node of config and quant, in contract order."""
    return {a.name: attribute_value(a, config, quant) for a in ATTRIBUTES}


def _bits(quant: Any) -> int:
    return 0 if quant is None else quant.bits


def conditions(item: Input) -> tuple[str, ...]:
    """The attributes that must all be non-zero for a node to carry item (none: always):
    its flag or width, the FFN biases' ffn_bias, a scale's weight_bits."""
    names = (item.present_when, item.also_when, WEIGHT_BITS if item.quantized == SCALES else "")
    return tuple(name for name in names if name)


def present(item: Input, config: Any, quant: Any = None) -> bool:
    """Whether a node of config (and quant) carries item."""
    values = attribute_values(config, quant)
    return all(values[name] for name in conditions(item))


def present_inputs(config: Any, quant: Any = None) -> list[Input]:
    return [i for i in INPUTS if present(i, config, quant)]


def dtype_of(item: Input, quant: Any = None) -> str:
    """item's dtype (one of the dtype constants above) in a node of quant."""
    return CODES_DTYPE if item.quantized == CODES and _bits(quant) else item.dtype


def shape_symbols(item: Input, quant: Any = None) -> tuple[str, ...]:
    """item's shape as symbols in a node of quant: a codes input's last dim packed."""
    if item.quantized == CODES and _bits(quant):
        return (*item.shape[:-1], f"{item.shape[-1]}*bits/{CODE_WORD_BITS}")
    return item.shape


def shape_of(item: Input, config: Any, tokens: int, quant: Any = None) -> tuple[int, ...]:
    """item's shape for config and quant, with T = tokens: a symbol is a product of factors
    (numbers, attributes' symbols, N = D*m, T), optionally divided by one (x/G)."""
    values = attribute_values(config, quant)
    sizes = {a.symbol: values[a.name] for a in ATTRIBUTES if a.symbol}
    sizes["N"] = config.num_departments * config.experts_per_department
    sizes["T"] = tokens

    def factor(name: str) -> int:
        return int(name) if name.isdigit() else sizes[name]

    def size(symbol: str) -> int:
        numerator, _, divisor = symbol.partition("/")
        product = 1
        for name in numerator.split("*"):
            product *= factor(name)
        return product // factor(divisor) if divisor else product

    return tuple(size(s) for s in shape_symbols(item, quant))


def enum_code(attribute: str, value: str) -> int:
    return ENUMS[attribute].index(value)


# ---------------------------------------------------------------------------------------
# The README's tables, rendered from the contract
# ---------------------------------------------------------------------------------------

# The plugin README, from a checkout's root: `--write-readme` rewrites it there by default.
README = Path("plugins") / "deamoe" / "README.md"
_ONNX_TYPE_NAMES = {"int": "INT", "bool": "INT", "float": "FLOAT", "str": "STRING"}


class _AnyQuantization:
    """Stands for a quantized node's QuantConfig in the README's texts (they depend on
    weight_bits > 0 only)."""

    bits = 1


def _shape_text(item: Input) -> str:
    shape = ", ".join(item.shape)
    text = f"[{shape}] (T dynamic)" if "T" in item.shape else f"[{shape}]"
    if item.quantized == CODES:
        text += f"; codes: [{', '.join(shape_symbols(item, _AnyQuantization))}]"
    return text


def _presence_text(item: Input) -> str:
    kinds = {a.name: a.kind for a in ATTRIBUTES}
    texts = [f"`{name} = 1`" if kinds[name] == "bool" else f"`{name} > 0`" for name in conditions(item)]
    return " and ".join(texts) or "always"


def readme_tables() -> dict[str, list[str]]:
    """The README's inputs and attributes tables (header and rows), by table name."""
    inputs = ["| # | name | shape | dtype | present when |", "| --- | --- | --- | --- | --- |"]
    texts = {ACTIVATION: "the node's dtype", FLOAT32: "float32", FLOAT32_OR_ACTIVATION: "float32 or the node's dtype"}
    for position, item in enumerate(INPUTS):
        dtype = texts[item.dtype]
        if item.quantized == CODES:
            dtype += f"; {dtype_of(item, _AnyQuantization)} codes if `{WEIGHT_BITS} > 0`"
        inputs.append(f"| {position} | {item.name} | {_shape_text(item)} | {dtype} | {_presence_text(item)} |")
    attributes = ["| attribute | ONNX type | meaning |", "| --- | --- | --- |"]
    for a in ATTRIBUTES:
        attributes.append(f"| {a.name} | {_ONNX_TYPE_NAMES[a.kind]} | {a.meaning} |")
    for name, value in SELECTOR_ATTRIBUTES.items():
        attributes.append(f"| {name} | STRING | {f'`{value}`' if value else 'empty'} |")
    return {"inputs": inputs, "attributes": attributes}


def _replace_table(text: str, header: str, rows: list[str]) -> str:
    lines = text.split("\n")
    start = lines.index(header)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join([*lines[:start], *rows, *lines[end:]])


def render_readme(text: str) -> str:
    """text with its contract tables replaced by the ones the contract renders."""
    headers = {
        "inputs": ("| # | name | shape | dtype | present when |", "| # | name | shape | present when |"),
        "attributes": ("| attribute | ONNX type | meaning |",),
    }
    for table, rows in readme_tables().items():
        lines = text.split("\n")
        header = next((h for h in headers[table] if h in lines), None)
        if header is None:
            raise ValueError(f"no {table} table (a line {headers[table][0]!r})")
        text = _replace_table(text, header, rows)
    return text


def tables_in(text: str) -> Iterable[list[str]]:
    """Every markdown table of text, as its lines."""
    table: list[str] = []
    for line in [*text.split("\n"), ""]:
        if line.startswith("|"):
            table.append(line)
        elif table:
            yield table
            table = []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deamoe_trt.contract", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--write-readme",
        nargs="?",
        const=README,
        type=Path,
        metavar="README",
        help=f"rewrite the contract tables of README (default {README}, from a checkout's root)",
    )
    args = parser.parse_args(argv)
    if args.write_readme:
        from ._io import atomic_write_text

        readme = args.write_readme
        if not readme.is_file():
            print(f"error: {readme} not found: run from the repository's root or name the README", file=sys.stderr)
            return 2
        try:
            text = render_readme(readme.read_text())
        except ValueError as err:
            print(f"error: {readme}: {err}", file=sys.stderr)
            return 2
        atomic_write_text(readme, text)
        print(f"wrote {readme}")
    else:
        print("\n\n".join("\n".join(rows) for rows in readme_tables().values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "ACTIVATION",
    "ATTRIBUTES",
    "ATTRIBUTE_NAMES",
    "CODES",
    "CODES_DTYPE",
    "CONFIG_ATTRIBUTES",
    "DOMAIN",
    "ENUMS",
    "FFN_BIAS",
    "FLOAT32",
    "INPUTS",
    "MAX_INPUTS",
    "OP_TYPE",
    "PLUGIN_NAMESPACE",
    "PLUGIN_VERSION",
    "QUANT_ATTRIBUTES",
    "SCALES",
    "WEIGHT_INPUTS",
    "Attribute",
    "Input",
    "attribute_value",
    "attribute_values",
    "conditions",
    "dtype_of",
    "present_inputs",
    "shape_of",
]
