"""Every copy of the plugin contract agrees with deamoe_trt/contract.py, C++ included.

The C++ files are read as text (no compiler, no TensorRT), so this runs everywhere; the
compiled checks of the same code are tests/plugins/deamoe/test_plugin_cpp.py (needs TensorRT headers).
Each test names the file and the construct it reads, so a drift fails with where to look.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from configs import GPT_OSS_STYLE
from deamoe_trt import DeaMoEConfig, DeaMoELayer, contract
from deamoe_trt.cuda import _abi
from deamoe_trt.dtypes import DTYPES
from deamoe_trt.export import plugin_node
from deamoe_trt.quant import BITS, GROUP_SIZES, QuantConfig
from deamoe_trt.trt import qdp

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "plugins" / "deamoe"
KERNELS = ROOT / "native" / "cuda"
HOST_BINDINGS = ROOT / "tests" / "native" / "cuda" / "host_bindings.py"
HARNESS = ROOT / "tests" / "plugins" / "deamoe" / "plugin_harness.cpp"

ATTRIBUTES = {a.name: a for a in contract.ATTRIBUTES}
SYMBOL_OF_PARAM = {a.param: a.symbol for a in contract.ATTRIBUTES if a.symbol}
# deamoePluginFields.cpp's readers and the PluginFieldType deamoePlugin.cpp serialises, per attribute kind.
READERS = {"int": "readInt32", "bool": "readBool", "float": "readFloat", "str": "readString"}
FIELD_KINDS = {"int": "kINT", "bool": "kBOOL", "float": "kFLOAT", "str": "kSTRING"}
PLUGIN_FIELD_TYPES = {"int": "kINT32", "bool": "kINT32", "float": "kFLOAT32", "str": "kCHAR"}
C_TYPES = {"int": "int32_t", "bool": "int32_t", "float": "float"}


def source(path: Path) -> str:
    """The file without comments, so commented-out code cannot satisfy a check."""
    text = path.read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def block(text: str, start: str, where: str) -> str:
    """The brace-delimited body that follows the first occurrence of start."""
    at = text.find(start)
    assert at >= 0, f"{where}: {start!r} not found"
    open_at = text.index("{", at + len(start) - 1 if start.endswith("{") else at)
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[open_at + 1 : i]
    raise AssertionError(f"{where}: unbalanced braces after {start!r}")


def enum_values(text: str, name: str, where: str) -> dict[str, int]:
    """enumerator -> value of `enum class name`, counting as C++ does."""
    values, next_value = {}, 0
    for item in block(text, f"enum class {name}", where).split(","):
        item = item.strip()
        if not item:
            continue
        enumerator, _, value = (part.strip() for part in item.partition("="))
        next_value = int(value) if value else next_value
        values[enumerator] = next_value
        next_value += 1
    return values


def struct_members(text: str, name: str, where: str) -> list[tuple[str, str]]:
    """(type, member) of `struct name`, in order."""
    body = block(text, f"struct {name}\n", where)
    return [(m.group(1).strip(), m.group(2)) for m in re.finditer(r"([\w:* ]+?)\s*(\w+);", body)]


# ---------------------------------------------------------------------------------------
# Python: the contract against DeaMoEConfig and the layer, and what is generated from it
# ---------------------------------------------------------------------------------------


def test_attributes_are_the_config_fields():
    fields = dataclasses.fields(DeaMoEConfig)
    assert [f.name for f in fields] == [a.name for a in contract.CONFIG_ATTRIBUTES], (
        "contract.ATTRIBUTES must list DeaMoEConfig's fields in order"
    )
    assert contract.ATTRIBUTES[: len(fields)] == contract.CONFIG_ATTRIBUTES, "the quantization's attributes come last"
    for f in fields:
        attribute = ATTRIBUTES[f.name]
        assert attribute.kind == f.type, f"{f.name}: DeaMoEConfig says {f.type}, the contract {attribute.kind}"
        has_default = f.default is not dataclasses.MISSING
        assert attribute.required is not has_default, f"{f.name}: required iff DeaMoEConfig has no default"
    for name, values in contract.ENUMS.items():
        from deamoe_trt import config as config_module

        assert values == getattr(config_module, name.upper() + "S"), f"config.{name.upper()}S vs contract.ENUMS"


def test_quantization_attributes_are_quant_config_fields():
    quant_fields = {f.name for f in dataclasses.fields(QuantConfig)}
    for attribute in contract.QUANT_ATTRIBUTES:
        source, _, field = attribute.source.partition(".")
        assert source == contract.QUANTIZATION and field in quant_fields, f"{attribute.name}: source {attribute.source}"
        assert attribute.kind == "int" and not attribute.required, f"{attribute.name}: optional int (0 = float)"
    assert (contract.BITS, contract.GROUP_SIZES) == (BITS, GROUP_SIZES), "contract vs deamoe_trt/quant.py"
    config = DeaMoEConfig(hidden_size=32, num_departments=2, experts_per_department=2, shared_intermediate_size=16,
                          private_intermediate_size=16, top_k=2, top_departments=1)  # fmt: skip
    assert contract.attribute_values(config) | contract.attribute_values(config, QuantConfig(4, 16)) == {
        **{a.name: getattr(config, a.name) for a in contract.CONFIG_ATTRIBUTES},
        "weight_bits": 4,
        "weight_group_size": 16,
    }
    float_values = contract.attribute_values(config)
    assert (float_values["weight_bits"], float_values["weight_group_size"]) == (0, 0), "a float node: 0, 0"


def test_inputs_are_the_layer_state_dict():
    # Every part present, so every input appears; shapes from the contract's symbols.
    config = DeaMoEConfig(hidden_size=8, num_departments=3, experts_per_department=2, shared_intermediate_size=6,
                          private_intermediate_size=4, top_k=2, top_departments=2, router_bias=True,
                          shared_expert_intermediate_size=5, shared_expert_gate=True)  # fmt: skip
    state = DeaMoELayer.random(config, seed=0).state_dict()
    float_inputs = contract.present_inputs(config)[1:]
    assert [i.name for i in float_inputs] == list(state), "weight inputs vs DeaMoELayer.state_dict() order"
    for item in float_inputs:
        assert tuple(state[item.name].shape) == contract.shape_of(item, config, tokens=3), item.name
    assert contract.shape_of(contract.INPUTS[0], config, tokens=3) == (3, 8)
    bare = config.replace(router_bias=False, shared_expert_intermediate_size=0, shared_expert_gate=False)
    assert plugin_node.weight_inputs(bare) == list(DeaMoELayer.random(bare, seed=0).state_dict())
    assert not any(i.quantized == contract.SCALES for i in contract.present_inputs(config)), "no scales when float"


@pytest.mark.parametrize("quantized", [False, True], ids=["float", "int4"])
def test_biased_inputs_are_the_biased_state_dict(quantized):
    # gpt-oss's parts (tests/configs.py GPT_OSS_STYLE): a logit bias, gate/up biases on every
    # part and down biases on the experts and shared experts; departments have none. The
    # biases are appended after the other inputs, carry their state_dict keys and shapes and
    # stay in the activation dtype (never quantized).
    quant = QuantConfig(4, 16) if quantized else None
    layer = DeaMoELayer.random(GPT_OSS_STYLE, seed=0)
    state = (layer.quantized(quant) if quant else layer).state_dict()
    inputs = contract.present_inputs(GPT_OSS_STYLE, quant)[1:]
    biases = ["router.logit_bias", "departments.gate_up_bias", "experts.gate_up_bias", "experts.down_bias",
              "shared_experts.gate_up_bias", "shared_experts.down_bias"]  # fmt: skip
    assert [i.name for i in inputs[-len(biases) :]] == biases, "the biases come last, in contract order"
    assert sorted(plugin_node.state_keys(GPT_OSS_STYLE, quant)) == sorted(state), "every tensor is an input"
    for item in inputs:
        if item.name in biases:
            assert contract.shape_of(item, GPT_OSS_STYLE, tokens=3, quant=quant) == tuple(state[item.name].shape)
            router = item.name.startswith("router.")
            assert contract.dtype_of(item, quant) == (contract.FLOAT32 if router else contract.ACTIVATION), item.name
    unbiased = GPT_OSS_STYLE.replace(ffn_bias=False, router_logit_bias=False)
    assert not set(biases) & set(plugin_node.weight_inputs(unbiased, quant)), "no biases when both flags are off"
    no_shared = GPT_OSS_STYLE.replace(shared_intermediate_size=0, shared_expert_intermediate_size=0)
    tail = [i.name for i in contract.present_inputs(no_shared)[-3:]]
    assert tail == biases[:1] + biases[2:4], "absent parts: no biases"


@pytest.mark.parametrize("bits", BITS)
def test_quantized_inputs_are_the_quantized_state_dict(bits):
    # A quantized node: codes inputs keep the weights' names and carry "<weight>.qweight"'s
    # bytes as int32 words; scale inputs are "<weight>.scales", appended in contract order.
    config = DeaMoEConfig(hidden_size=32, num_departments=3, experts_per_department=2, shared_intermediate_size=16,
                          private_intermediate_size=32, top_k=2, top_departments=2, router_bias=True,
                          shared_expert_intermediate_size=64, shared_expert_gate=True, ffn_bias=True,
                          router_logit_bias=True)  # fmt: skip
    quant = QuantConfig(bits, 16)
    state = DeaMoELayer.random(config, seed=0).quantized(quant).state_dict()
    inputs = contract.present_inputs(config, quant)
    codes = [i for i in inputs if i.quantized == contract.CODES]
    scales = [i for i in inputs if i.quantized == contract.SCALES]
    state_scales = [k for k in state if k.endswith(".scales")]
    assert [i.name + ".scales" for i in codes] == [i.name for i in scales] == state_scales
    assert inputs == list(contract.INPUTS), "every input present, scales and biases last"
    word_bytes = contract.CODE_WORD_BITS // 8
    for item in inputs[1:]:
        shape = contract.shape_of(item, config, tokens=3, quant=quant)
        if item.quantized == contract.CODES:
            qweight = state[item.name + ".qweight"]
            assert contract.dtype_of(item, quant) == contract.CODES_DTYPE
            assert (*shape[:-1], shape[-1] * word_bytes) == tuple(qweight.shape), item.name
        else:
            assert contract.dtype_of(item, quant) == item.dtype
            assert shape == tuple(state[item.name].shape), item.name


def test_python_copies_are_generated_from_the_contract():
    assert plugin_node.ATTRIBUTE_TYPES.keys() == {*ATTRIBUTES, *contract.SELECTOR_ATTRIBUTES}
    assert tuple(i.qdp_arg for i in contract.INPUTS) == qdp.TENSOR_ARGS
    assert tuple(qdp.ATTRS) == tuple(ATTRIBUTES)
    params = [a.param for a in contract.ATTRIBUTES] + list(contract.DTYPE_PARAMS)
    assert [f for f, _ in _abi.LayerParams._fields_] == params
    assert [f for f, _ in _abi.LayerWeights._fields_] == [i.weights_field for i in contract.WEIGHT_INPUTS]
    config = DeaMoEConfig(hidden_size=32, num_departments=2, experts_per_department=2, shared_intermediate_size=16,
                          private_intermediate_size=16, top_k=2, top_departments=1)  # fmt: skip
    quantized = _abi.layer_params(config, True, QuantConfig(8, 32))
    assert (quantized.weightBits, quantized.weightGroupSize, quantized.routerWeightFloat32) == (8, 32, 1)
    assert (_abi.layer_params(config).weightBits, _abi.layer_params(config).weightGroupSize) == (0, 0)


def test_qdp_signatures_spell_out_the_contract():
    # tensorrt.plugin reads these signatures, so they are written out; read them as written.
    tree = ast.parse((ROOT / "deamoe_trt" / "trt" / "qdp.py").read_text())
    functions = {n.name: [a.arg for a in n.args.args] for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    tensors, attributes = [i.qdp_arg for i in contract.INPUTS], list(ATTRIBUTES)
    assert functions["deamoe_desc"] == [*tensors, *attributes], "qdp.py deamoe_desc's parameters"
    assert functions["deamoe_autotune"] == [*tensors, "outputs"], "qdp.py deamoe_autotune's parameters"
    assert functions["deamoe_impl"] == [*tensors, *attributes, "outputs", "stream"], "qdp.py deamoe_impl's parameters"


def test_readme_tables_are_the_contract():
    text = (PLUGIN / "README.md").read_text()
    tables = list(contract.tables_in(text))
    for name, rows in contract.readme_tables().items():
        assert rows in tables, (
            f"plugins/deamoe/README.md: the {name} table differs from deamoe_trt/contract.py; "
            "run `python -m deamoe_trt.contract --write-readme`"
        )


# ---------------------------------------------------------------------------------------
# C++: deamoeKernels.h (the kernels' ABI) against the contract and cuda/_abi.py
# ---------------------------------------------------------------------------------------


def test_kernel_enums():
    text = source(KERNELS / "deamoeKernels.h")
    for attribute, type_name in contract.ENUM_TYPES.items():
        want = {"k" + value.upper(): code for code, value in enumerate(contract.ENUMS[attribute])}
        assert enum_values(text, type_name, "deamoeKernels.h") == want, f"deamoeKernels.h enum {type_name}"
    # deamoe::DataType's enumerators are TensorRT's names with a k: kFLOAT, kHALF, kBF16.
    kernel_types = enum_values(text, "DataType", "deamoeKernels.h")
    assert kernel_types == {f"k{d.trt}": d.kernel for d in DTYPES}, "deamoeKernels.h DataType vs deamoe_trt/dtypes.py"
    status = enum_values(text, "Status", "deamoeKernels.h")
    assert sorted(status.values()) == sorted(_abi.STATUS_NAMES), "deamoeKernels.h Status vs cuda/_abi.STATUS_NAMES"
    assert status["kSUCCESS"] == _abi.SUCCESS


def test_kernel_structs():
    text = source(KERNELS / "deamoeKernels.h")
    want = [(contract.ENUM_TYPES[a.name] if a.kind == "str" else C_TYPES[a.kind], a.param) for a in contract.ATTRIBUTES]
    want += [("int32_t", name) for name in contract.DTYPE_PARAMS]  # after the attributes' members
    assert struct_members(text, "LayerParams", "deamoeKernels.h") == want, "deamoeKernels.h struct LayerParams"
    weights = [("void const*", i.weights_field) for i in contract.WEIGHT_INPUTS]
    assert struct_members(text, "LayerWeights", "deamoeKernels.h") == weights, "deamoeKernels.h struct LayerWeights"


# C parameter/return type -> the ctypes type cuda/_abi.py declares for it.
def _ctype_of(c_type: str):
    import ctypes

    c_type = " ".join(c_type.replace("*", " * ").split())
    if c_type in ("deamoe::LayerParams const *",):
        return ctypes.POINTER(_abi.LayerParams)
    if c_type in ("deamoe::LayerWeights const *",):
        return ctypes.POINTER(_abi.LayerWeights)
    if c_type.endswith("*") and c_type.startswith("char const"):
        return ctypes.c_char_p
    if c_type.endswith("*") or c_type == "cudaStream_t":
        return ctypes.c_void_p
    return {"int32_t": ctypes.c_int32, "size_t": ctypes.c_size_t, "void": None}[c_type]


def test_c_abi_prototypes():
    text = source(KERNELS / "deamoeKernels.h")
    body = block(text, 'extern "C"', "deamoeKernels.h")
    declared = {}
    for m in re.finditer(r"([\w:]+(?:\s+const)?\s*\**)\s*(deamoe_\w+)\(([^)]*)\);", body):
        params = [p.strip() for p in m.group(3).split(",") if p.strip() and p.strip() != "void"]
        # Drop each parameter's name: the type is everything before the last word.
        types = [re.sub(r"\s*\b\w+$", "", p) for p in params]
        declared[m.group(2)] = (_ctype_of(m.group(1)), [_ctype_of(t) for t in types])
    assert set(declared) == set(_abi.PROTOTYPES), 'deamoeKernels.h extern "C" functions vs cuda/_abi.PROTOTYPES'
    for name, (restype, argtypes) in _abi.PROTOTYPES.items():
        assert declared[name] == (restype, argtypes), f"deamoeKernels.h {name} vs cuda/_abi.PROTOTYPES"


def test_host_test_structs_match_bindings():
    # tests/native/cuda/host_bindings.py mirrors the host-compiled routing and plan configs.
    from native.cuda import host_bindings

    for header, struct, binding in (
        ("deamoeRouting.cuh", "RoutingConfig", host_bindings.RoutingConfigC),
        ("deamoePlan.cuh", "PlanConfig", host_bindings.PlanConfigC),
    ):
        members = struct_members(source(KERNELS / header), struct, header)
        names = {"int32_t": "c_int", "float": "c_float"}
        assert [(names[t], m) for t, m in members] == [(t.__name__, m) for m, t in binding._fields_], (
            f"{header} struct {struct} vs host_bindings.{binding.__name__}"
        )


# ---------------------------------------------------------------------------------------
# C++: the TensorRT plugin (deamoePlugin.h/.cpp, deamoePluginFields.h/.cpp) and its harness
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plugin_cpp() -> str:
    """The plugin class and its creator: serialisation and enqueue."""
    return source(PLUGIN / "deamoePlugin.cpp")


@pytest.fixture(scope="module")
def fields_h() -> str:
    """The field table."""
    return source(PLUGIN / "deamoePluginFields.h")


@pytest.fixture(scope="module")
def fields_cpp() -> str:
    """Fields to LayerParams, and the node's inputs."""
    return source(PLUGIN / "deamoePluginFields.cpp")


def test_plugin_identity_and_roles():
    text = source(PLUGIN / "deamoePlugin.h")
    identity = dict(re.findall(r'constexpr char const\* (kPLUGIN_\w+)\{"([^"]*)"\};', text))
    assert identity == {
        "kPLUGIN_NAME": contract.OP_TYPE,
        "kPLUGIN_VERSION": contract.PLUGIN_VERSION,
        "kPLUGIN_NAMESPACE": contract.PLUGIN_NAMESPACE,
    }, "deamoePlugin.h kPLUGIN_NAME/VERSION/NAMESPACE"
    roles = enum_values(text, "InputRole", "deamoePlugin.h")
    assert roles == {i.role: n for n, i in enumerate(contract.INPUTS)}, "deamoePlugin.h enum InputRole"


def test_plugin_field_table(fields_h):
    rows = re.findall(r'\{"(\w+)", FieldKind::(k\w+), (true|false)\}', block(fields_h, "kFIELDS[] =", "kFIELDS"))
    want = [(a.name, FIELD_KINDS[a.kind], "true" if a.required else "false") for a in contract.ATTRIBUTES]
    assert rows == want, "deamoePluginFields.h kFIELDS"
    ignored = re.search(r"kIGNORED_FIELDS\[\] = \{([^}]*)\}", fields_h)
    assert ignored and re.findall(r'"(\w+)"', ignored.group(1)) == list(contract.SELECTOR_ATTRIBUTES)


def test_plugin_parses_every_field(fields_cpp):
    body = block(fields_cpp, "LayerParams paramsFromFields(", "paramsFromFields")
    parsed = re.findall(r'name == "(\w+)"\)\s*p\.(\w+) = (\w+)\((?:(read\w+)\()?', body)
    want = []
    for a in contract.ATTRIBUTES:
        if a.kind == "str":
            parser = "parse" + contract.ENUM_TYPES[a.name]
            want.append((a.name, a.param, parser, "readString"))
        else:
            want.append((a.name, a.param, READERS[a.kind], ""))
    assert parsed == want, "deamoePluginFields.cpp paramsFromFields: name -> member and reader"
    for attribute, type_name in contract.ENUM_TYPES.items():
        parse = block(fields_cpp, f"{type_name} parse{type_name}(", f"parse{type_name}")
        pairs = re.findall(r'text == "(\w+)"\)\s*\{\s*return ' + type_name + r"::(k\w+);", parse)
        assert pairs == [(v, "k" + v.upper()) for v in contract.ENUMS[attribute]], (
            f"deamoePluginFields.cpp parse{type_name}"
        )


def test_plugin_serialises_every_field(plugin_cpp):
    body = block(plugin_cpp, "mSerialFields = {", "getFieldsToSerialize")
    fields = re.findall(r'PluginField\("(\w+)",\s*[&]?m(\w+)[.\w]*(?:\.c_str\(\))?,\s*PluginFieldType::(k\w+)', body)
    members = re.findall(r'PluginField\("\w+",\s*&mParams\.(\w+)', body)
    assert [(n, t) for n, _, t in fields] == [(a.name, PLUGIN_FIELD_TYPES[a.kind]) for a in contract.ATTRIBUTES], (
        "deamoePlugin.cpp getFieldsToSerialize: names and PluginFieldTypes"
    )
    assert members == [a.param for a in contract.ATTRIBUTES if a.kind != "str"], (
        "deamoePlugin.cpp getFieldsToSerialize: LayerParams members"
    )


def test_plugin_inputs(plugin_cpp, fields_cpp):
    names = dict(re.findall(r'case InputRole::(k\w+): return "([\w.]+)";', block(fields_cpp, "inputRoleName(", "")))
    assert names == {i.role: i.name for i in contract.INPUTS}, "deamoePluginFields.cpp inputRoleName"

    # presentInputs: the roles always there, then `if (p.member ...)` blocks of push_backs.
    body = block(fields_cpp, "std::vector<InputRole> presentInputs(", "presentInputs")
    always = re.findall(r"InputRole::(k\w+)", body[: body.index("if")])
    conditional = {
        role: set(re.findall(r"p\.(\w+)", condition))
        for condition, pushes in re.findall(r"if \(([^)]*)\)\s*\{([^}]*)\}", body)
        for role in re.findall(r"InputRole::(k\w+)", pushes)
    }
    param_of = {a.name: a.param for a in contract.ATTRIBUTES}
    assert always == [i.role for i in contract.INPUTS if not i.present_when], "deamoePluginFields.cpp presentInputs"
    want = {i.role: {param_of[name] for name in contract.conditions(i)} for i in contract.INPUTS if i.present_when}
    assert conditional == want, "deamoePluginFields.cpp presentInputs: which flags or widths make each input present"

    # logicalShape: C++ expressions back to the contract's symbols (G: the group size or 1).
    body = block(fields_cpp, "std::vector<int64_t> logicalShape(", "logicalShape")
    shapes = {}
    for role, dims in re.findall(r"case InputRole::(k\w+): return \{([^;]*)\};", body):
        symbols = []
        for dim in re.split(r",\s*(?![^{]*\})", dims):
            dim = re.sub(r"int64_t\{p\.(\w+)\}|p\.(\w+)", lambda m: SYMBOL_OF_PARAM[m.group(1) or m.group(2)], dim)
            symbols.append("T" if dim.strip() == "-1" else dim.replace(" ", ""))
        shapes[role] = tuple(symbols)
    assert shapes == {i.role: i.shape for i in contract.INPUTS}, "deamoePluginFields.cpp logicalShape"

    # enqueue: each role's pointer lands on its LayerWeights member, and an input of either
    # dtype sets its LayerParams flag there.
    body = block(plugin_cpp, "DeaMoEPlugin::enqueue(", "enqueue")
    cases = dict(re.findall(r"case InputRole::(k\w+):(.*?)(?=case InputRole::|\}\s*$)", body, flags=re.S))
    landed = {role: m.group(1) for role, text in cases.items() if (m := re.search(r"weights\.(\w+) = ptr;", text))}
    assert landed == {i.role: i.weights_field for i in contract.WEIGHT_INPUTS}, "deamoePlugin.cpp enqueue's weights"
    for item in contract.INPUTS:
        if item.dtype_param:
            where = f"deamoePlugin.cpp enqueue sets {item.dtype_param}"
            assert f"params.{item.dtype_param} =" in cases[item.role], where


def test_plugin_quantized_inputs(fields_cpp):
    # The codes' element type and packing (deamoePlugin.h), the inputs that carry codes.
    header = source(PLUGIN / "deamoePlugin.h")
    codes_type = re.search(r"constexpr nvinfer1::DataType kCODES_TYPE\{nvinfer1::DataType::(k\w+)\};", header)
    word_bits = re.search(r"constexpr int32_t kCODE_WORD_BITS\{(\d+)\};", header)
    assert codes_type and codes_type.group(1) == {"int32": "kINT32"}[contract.CODES_DTYPE], "deamoePlugin.h kCODES_TYPE"
    assert word_bits and int(word_bits.group(1)) == contract.CODE_WORD_BITS, "deamoePlugin.h kCODE_WORD_BITS"
    packing = block(fields_cpp, "std::vector<int64_t> expectedShape(", "expectedShape")
    assert re.search(r"if \(p\.weightBits > 0 && carriesCodes\(role\)\)", packing), "expectedShape packs codes"
    assert "shape.back() = shape.back() * p.weightBits / kCODE_WORD_BITS;" in packing, "expectedShape's packing"
    carries = block(fields_cpp, "bool carriesCodes(", "carriesCodes")
    roles = re.findall(r"case InputRole::(k\w+):", carries)
    assert roles == [i.role for i in contract.INPUTS if i.quantized == contract.CODES], "carriesCodes' roles"
    # checkQuantization's bits and group sizes: the contract's (= deamoe_trt/quant.py's).
    check = block(fields_cpp, "void checkQuantization(", "checkQuantization")
    assert tuple(int(b) for b in re.findall(r"p\.weightBits != (\d+)", check)) == contract.BITS, "its bits"
    assert tuple(int(g) for g in re.findall(r"(?<!% )G != (\d+)", check)) == contract.GROUP_SIZES, "its group sizes"


def test_plugin_harness_expects_the_contract():
    text = source(HARNESS)
    expected = re.search(r"char const\* expected\[\] = \{([^}]*)\}", text)
    assert expected and re.findall(r'"(\w+)"', expected.group(1)) == list(ATTRIBUTES), "plugin_harness.cpp expected[]"
    for count in re.findall(r"nbFields == (\d+)", text):
        assert int(count) == len(contract.ATTRIBUTES), "plugin_harness.cpp field counts"
    positions = re.findall(r"fields\[(\d+)\]\.type == PluginFieldType::(k\w+), \"(\w+) is", text)
    assert positions, "plugin_harness.cpp checks field types by position"
    for index, field_type, name in positions:
        attribute = contract.ATTRIBUTES[int(index)]
        assert (attribute.name, PLUGIN_FIELD_TYPES[attribute.kind]) == (name, field_type), f"plugin_harness.cpp {name}"


def test_write_readme_rewrites_the_tables_of_the_readme_it_is_given(tmp_path, capsys):
    readme = (PLUGIN / "README.md").read_text()
    rows = [line for line in readme.split("\n") if line.startswith("| weight_bits | INT |")]
    assert len(rows) == 1, "the attributes table has one weight_bits row"
    stale = tmp_path / "README.md"
    stale.write_text(readme.replace(rows[0], "| weight_bits | INT | stale |"))
    assert contract.main(["--write-readme", str(stale)]) == 0
    assert stale.read_text() == readme


def test_write_readme_refuses_a_missing_readme_in_one_line(tmp_path, capsys):
    assert contract.main(["--write-readme", str(tmp_path / "absent.md")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
