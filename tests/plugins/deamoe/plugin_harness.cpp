/*
 * Host-only harness for the DeaMoE plugin's TensorRT glue (plugins/deamoe/deamoePlugin*.cpp).
 *
 * Compiled by tests/plugins/deamoe/test_plugin_cpp.py against TensorRT *headers* only: the kernels are
 * stubbed below, and the plugin is built as
 * its dynamic-library variant (DEAMOE_PLUGIN_DYNAMIC=1), so nothing from libnvinfer or a
 * GPU is needed. It drives the plugin the way the ONNX parser and the builder/runtime do:
 * fields as the parser makes them, format negotiation, shape checks, workspace, enqueue's
 * mapping of node inputs to kernel weights, and serialisation round trips.
 *
 * Prints one line per failed check and "N passed, M failed" last; exits non-zero on failure.
 */
#include "deamoePlugin.h"
#include "deamoePluginUtils.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

using namespace nvinfer1;
using deamoe::plugin::DeaMoEPlugin;
using deamoe::plugin::DeaMoEPluginCreator;

// ---------------------------------------------------------------------------------------
// Stubs: kernels (deamoeKernels.h) and the CUDA runtime calls the plugin makes
// ---------------------------------------------------------------------------------------

namespace
{
struct ForwardCall
{
    int calls = 0;
    deamoe::LayerParams params{};
    deamoe::LayerWeights weights{};
    void const* hidden = nullptr;
    void* output = nullptr;
    int32_t numTokens = 0;
    void* workspace = nullptr;
    size_t workspaceBytes = 0;
    deamoe::DataType dtype = deamoe::DataType::kFLOAT;
    int32_t variant = -1;
};
ForwardCall gForward;
deamoe::Status gForwardResult = deamoe::Status::kSUCCESS;
deamoe::Status gSupportedResult = deamoe::Status::kSUCCESS;
char const* gLastError = "";
// The device currentDeviceName reports (a variant table's file is named after it).
char const* gDeviceName = "Harness GPU (1)";

size_t dtypeBytes(deamoe::DataType dtype)
{
    return dtype == deamoe::DataType::kFLOAT ? 4 : 2;
}
} // namespace

namespace deamoe
{
char const* statusString(Status status) noexcept
{
    switch (status)
    {
    case Status::kSUCCESS: return "success";
    case Status::kINVALID_PARAMS: return "invalid params";
    case Status::kINVALID_ARGUMENT: return "invalid argument";
    case Status::kUNSUPPORTED: return "unsupported";
    case Status::kCUDA_ERROR: return "CUDA error";
    }
    return "?";
}

char const* lastErrorMessage() noexcept
{
    return gLastError;
}

// The checks DeaMoEConfig makes that matter to these tests.
Status validate(LayerParams const& p) noexcept
{
    gLastError = "";
    if (p.hidden < 1 || p.numDepartments < 1 || p.expertsPerDepartment < 1 || p.topK < 1 || p.topDepartments < 1
        || p.sharedWidth < 0 || p.privateWidth < 0 || p.sharedExpertWidth < 0
        || (p.sharedWidth == 0 && p.privateWidth == 0) || p.topDepartments > p.numDepartments
        || p.topK > p.topDepartments * p.expertsPerDepartment || !(p.routedScalingFactor > 0.0F)
        || (p.sharedExpertGate && p.sharedExpertWidth == 0))
    {
        gLastError = "stub: top_k must be <= top_departments * experts_per_department";
        return Status::kINVALID_PARAMS;
    }
    return Status::kSUCCESS;
}

size_t workspaceSize(LayerParams const& p, int32_t maxTokens, DataType dtype) noexcept
{
    return 1000 + static_cast<size_t>(maxTokens) * static_cast<size_t>(p.hidden) * dtypeBytes(dtype);
}

Status checkSupported(LayerParams const& p, DataType dtype) noexcept
{
    Status const valid = validate(p);
    if (valid != Status::kSUCCESS)
        return valid;
    (void) dtype;
    gLastError = gSupportedResult == Status::kSUCCESS ? "" : "stub: hidden_size 64 must be a multiple of 99";
    return gSupportedResult;
}

// The stub's variants: "default", then "v1" .. "v7" (a table names variants by name).
char const* variantName(int32_t variant) noexcept
{
    static char const* const names[kNumVariants] = {"default", "v1", "v2", "v3", "v4", "v5", "v6", "v7"};
    return variant >= 0 && variant < kNumVariants ? names[variant] : nullptr;
}

Status currentDeviceName(char* name, size_t capacity) noexcept
{
    std::snprintf(name, capacity, "%s", gDeviceName);
    return Status::kSUCCESS;
}

Status forwardVariant(LayerParams const& params, LayerWeights const& weights, DataType dtype, int32_t variant,
    void const* hidden, void* output, int32_t numTokens, void* workspace, size_t workspaceBytes, cudaStream_t) noexcept
{
    gForward.calls++;
    gForward.variant = variant;
    gForward.params = params;
    gForward.weights = weights;
    gForward.hidden = hidden;
    gForward.output = output;
    gForward.numTokens = numTokens;
    gForward.workspace = workspace;
    gForward.workspaceBytes = workspaceBytes;
    gForward.dtype = dtype;
    gLastError = gForwardResult == Status::kSUCCESS ? "" : "stub launch failure (cudaErrorLaunchFailure)";
    return gForwardResult;
}
} // namespace deamoe

// ---------------------------------------------------------------------------------------
// Test scaffolding
// ---------------------------------------------------------------------------------------

namespace
{
int gPassed = 0;
int gFailed = 0;

void check(bool ok, std::string const& what)
{
    if (ok)
    {
        ++gPassed;
    }
    else
    {
        ++gFailed;
        std::printf("FAILED: %s\n", what.c_str());
    }
}

// Captures what the plugin reports, as a builder's logger would.
class CaptureLogger : public ILogger
{
public:
    void log(Severity severity, AsciiChar const* msg) noexcept override
    {
        if (severity <= Severity::kWARNING)
        {
            last = msg;
        }
    }
    std::string last;
};

class Finder : public ILoggerFinder
{
public:
    ILogger* findLogger() override { return &logger; }
    CaptureLogger logger;
};

Finder gFinder;

bool lastErrorHas(std::string const& needle)
{
    return gFinder.logger.last.find(needle) != std::string::npos;
}

// An execution context's error recorder, keeping what is reported.
class FakeErrorRecorder : public IErrorRecorder
{
public:
    int32_t getNbErrors() const noexcept override { return static_cast<int32_t>(mErrors.size()); }
    ErrorCode getErrorCode(int32_t i) const noexcept override { return mErrors.at(i).first; }
    ErrorDesc getErrorDesc(int32_t i) const noexcept override { return mErrors.at(i).second.c_str(); }
    bool hasOverflowed() const noexcept override { return false; }
    void clear() noexcept override { mErrors.clear(); }
    bool reportError(ErrorCode code, ErrorDesc desc) noexcept override
    {
        mErrors.emplace_back(code, desc);
        return false;
    }
    RefCount incRefCount() noexcept override { return 1; }
    RefCount decRefCount() noexcept override { return 0; }

private:
    std::vector<std::pair<ErrorCode, std::string>> mErrors;
};

class FakeResourceContext : public IPluginResourceContext
{
public:
    IGpuAllocator* getGpuAllocator() const noexcept override { return nullptr; }
    IErrorRecorder* getErrorRecorder() const noexcept override { return recorder; }
    IErrorRecorder* recorder = nullptr;
};

// Node attributes as TensorRT's ONNX parser turns them into PluginFields: INT -> one int32
// (kINT32), FLOAT -> one float (kFLOAT32), STRING -> chars plus a NUL (kCHAR, length incl. NUL).
class Fields
{
public:
    Fields& i32(char const* name, int32_t value)
    {
        return add(name, PluginFieldType::kINT32, &value, sizeof(value), 1);
    }
    Fields& i64(char const* name, int64_t value)
    {
        return add(name, PluginFieldType::kINT64, &value, sizeof(value), 1);
    }
    Fields& f32(char const* name, float value)
    {
        return add(name, PluginFieldType::kFLOAT32, &value, sizeof(value), 1);
    }
    Fields& str(char const* name, std::string const& value, bool withNul = true)
    {
        auto const length = static_cast<int32_t>(value.size() + (withNul ? 1 : 0));
        return add(name, PluginFieldType::kCHAR, value.c_str(), value.size() + 1, length);
    }
    Fields& without(char const* name)
    {
        for (auto it = mEntries.begin(); it != mEntries.end(); ++it)
        {
            if (it->name == name)
            {
                mEntries.erase(it);
                break;
            }
        }
        return *this;
    }
    // Rebuilt on every call so that copies of a Fields point into their own storage.
    PluginFieldCollection const* fc()
    {
        mFields.clear();
        for (auto const& e : mEntries)
        {
            mFields.emplace_back(e.name.c_str(), e.bytes.data(), e.type, e.length);
        }
        mFC.nbFields = static_cast<int32_t>(mFields.size());
        mFC.fields = mFields.data();
        return &mFC;
    }

private:
    struct Entry
    {
        std::string name;
        PluginFieldType type;
        std::vector<char> bytes;
        int32_t length;
    };
    Fields& add(char const* name, PluginFieldType type, void const* data, size_t bytes, int32_t length)
    {
        auto const* p = static_cast<char const*>(data);
        mEntries.push_back(Entry{name, type, std::vector<char>(p, p + bytes), length});
        return *this;
    }
    std::vector<Entry> mEntries;
    std::vector<PluginField> mFields;
    PluginFieldCollection mFC{};
};

// The tiny preset, every attribute the exporter writes.
Fields tinyFields()
{
    Fields f;
    f.i32("hidden_size", 64)
        .i32("num_departments", 4)
        .i32("experts_per_department", 4)
        .i32("shared_intermediate_size", 32)
        .i32("private_intermediate_size", 16)
        .i32("top_k", 4)
        .i32("top_departments", 2)
        .str("score_func", "softmax")
        .str("department_score", "max")
        .i32("norm_topk_prob", 1)
        .f32("routed_scaling_factor", 1.0F)
        .i32("router_bias", 0)
        .i32("shared_expert_intermediate_size", 0)
        .i32("shared_expert_gate", 0);
    return f;
}

// Every optional input present: bias, departments, experts, gated shared experts.
Fields fullFields()
{
    Fields f;
    f.i32("hidden_size", 32)
        .i32("num_departments", 2)
        .i32("experts_per_department", 4)
        .i32("shared_intermediate_size", 8)
        .i32("private_intermediate_size", 4)
        .i32("top_k", 3)
        .i32("top_departments", 1)
        .str("score_func", "sigmoid")
        .str("department_score", "sum_top2")
        .i32("norm_topk_prob", 1)
        .f32("routed_scaling_factor", 2.5F)
        .i32("router_bias", 1)
        .i32("shared_expert_intermediate_size", 16)
        .i32("shared_expert_gate", 1);
    return f;
}

// Every optional input of a quantized node: fullFields' layer with widths that are whole
// groups, weight_bits bits, weight_group_size group.
Fields quantFields(int32_t bits, int32_t group)
{
    Fields f;
    f.i32("hidden_size", 32)
        .i32("num_departments", 2)
        .i32("experts_per_department", 4)
        .i32("shared_intermediate_size", 32)
        .i32("private_intermediate_size", 32)
        .i32("top_k", 3)
        .i32("top_departments", 1)
        .str("score_func", "sigmoid")
        .str("department_score", "sum_top2")
        .i32("norm_topk_prob", 1)
        .f32("routed_scaling_factor", 2.5F)
        .i32("router_bias", 1)
        .i32("shared_expert_intermediate_size", 64)
        .i32("shared_expert_gate", 1)
        .i32("weight_bits", bits)
        .i32("weight_group_size", group);
    return f;
}

// gpt-oss's layer in department form (tests/configs.py GPT_OSS_STYLE): FFN biases, the
// clamped SwiGLU, a router logit bias and an ungated shared expert.
Fields gptOssFields()
{
    Fields f;
    f.i32("hidden_size", 32)
        .i32("num_departments", 4)
        .i32("experts_per_department", 4)
        .i32("shared_intermediate_size", 16)
        .i32("private_intermediate_size", 16)
        .i32("top_k", 4)
        .i32("top_departments", 2)
        .i32("shared_expert_intermediate_size", 16)
        .i32("ffn_bias", 1)
        .str("activation", "swiglu_clamped")
        .f32("swiglu_alpha", 1.702F)
        .f32("swiglu_limit", 1.0F)
        .i32("router_logit_bias", 1);
    return f;
}

// gptOssFields' 14 inputs: hidden, router, departments x2, experts x2, shared experts x2,
// then router.logit_bias (8, float32) and the five FFN biases.
std::vector<std::vector<int64_t>> gptOssShapes(int64_t tokens)
{
    return {{tokens, 32}, {16, 32}, {4, 32, 32}, {4, 32, 16}, {16, 32, 32}, {16, 32, 16}, {32, 32}, {32, 16}, {16},
        {4, 32}, {16, 32}, {16, 32}, {32}, {32}};
}

// quantFields' 16 inputs: codes' last dim cols * bits / 32 int32 words, scales cols / group.
std::vector<std::vector<int64_t>> quantShapes(int64_t tokens, int64_t bits, int64_t group)
{
    return {{tokens, 32}, {8, 32}, {8}, {2, 64, 32 * bits / 32}, {2, 32, 32 * bits / 32}, {8, 64, 32 * bits / 32},
        {8, 32, 32 * bits / 32}, {128, 32 * bits / 32}, {32, 64 * bits / 32}, {1, 32}, {2, 64, 32 / group},
        {2, 32, 32 / group}, {8, 64, 32 / group}, {8, 32, 32 / group}, {128, 32 / group}, {32, 64 / group}};
}

// The type of quantFields' input i in a node of type: packed codes (3-8) int32, router.bias
// (2) float32, the others (scales included) the node's.
DataType quantType(size_t i, DataType type)
{
    return i >= 3 && i <= 8 ? DataType::kINT32 : i == 2 ? DataType::kFLOAT : type;
}

// Distinct stand-in device pointers for enqueue: input i at &bytes[i], the output after them.
struct FakeBuffers
{
    explicit FakeBuffers(size_t nbInputs)
        : bytes(nbInputs + 1)
        , inputs(nbInputs)
    {
        for (size_t i = 0; i < nbInputs; ++i)
        {
            inputs[i] = &bytes[i];
        }
        outputs[0] = &bytes[nbInputs];
    }
    std::vector<char> bytes;
    std::vector<void const*> inputs;
    void* outputs[1];
};

struct PluginDeleter
{
    void operator()(IPluginV3* p) const { delete p; }
};
using PluginPtr = std::unique_ptr<IPluginV3, PluginDeleter>;

DeaMoEPluginCreator& creator()
{
    int32_t n = 0;
    IPluginCreatorInterface* const* creators = getCreators(n);
    return *static_cast<DeaMoEPluginCreator*>(creators[0]);
}

PluginPtr create(Fields& f, TensorRTPhase phase = TensorRTPhase::kBUILD)
{
    return PluginPtr(creator().createPlugin("layer0", f.fc(), phase));
}

Dims dims(std::vector<int64_t> const& values)
{
    Dims d{};
    d.nbDims = static_cast<int32_t>(values.size());
    for (size_t i = 0; i < values.size(); ++i)
    {
        d.d[i] = values[i];
    }
    return d;
}

PluginTensorDesc desc(
    std::vector<int64_t> const& shape, DataType type = DataType::kHALF, TensorFormat format = TensorFormat::kLINEAR)
{
    PluginTensorDesc d{};
    d.dims = dims(shape);
    d.type = type;
    d.format = format;
    d.scale = 1.0F;
    return d;
}

DynamicPluginTensorDesc dyn(
    std::vector<int64_t> const& shape, DataType type = DataType::kHALF, int64_t minTokens = 1, int64_t maxTokens = 16)
{
    DynamicPluginTensorDesc d{};
    d.desc = desc(shape, type);
    d.min = dims(shape);
    d.max = dims(shape);
    d.opt = dims(shape);
    if (!shape.empty() && shape[0] < 0)
    {
        d.min.d[0] = minTokens;
        d.max.d[0] = maxTokens;
        d.opt.d[0] = minTokens;
    }
    return d;
}

// Shapes of the tiny preset's node inputs: hidden, router, departments x2, experts x2.
std::vector<std::vector<int64_t>> tinyShapes(int64_t tokens)
{
    return {{tokens, 64}, {16, 64}, {4, 64, 64}, {4, 64, 32}, {16, 32, 64}, {16, 64, 16}};
}

std::vector<std::vector<int64_t>> fullShapes(int64_t tokens)
{
    return {{tokens, 32}, {8, 32}, {8}, {2, 16, 32}, {2, 32, 8}, {8, 8, 32}, {8, 32, 4}, {32, 32}, {32, 16}, {1, 32}};
}

std::string paramsOf(IPluginV3* plugin)
{
    return deamoe::plugin::describe(static_cast<DeaMoEPlugin*>(plugin)->params());
}

struct FakeExprBuilder : IExprBuilder
{
};

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

void testCreatorIdentity()
{
    int32_t n = 0;
    IPluginCreatorInterface* const* creators = getCreators(n);
    check(n == 1 && creators != nullptr && creators[0] != nullptr, "getCreators returns one creator");
    check(std::strcmp(creators[0]->getInterfaceInfo().kind, "PLUGIN CREATOR_V3ONE") == 0,
        "the creator is an IPluginCreatorV3One");
    auto& c = creator();
    check(std::strcmp(c.getPluginName(), "DeaMoE") == 0, "plugin name DeaMoE");
    check(std::strcmp(c.getPluginVersion(), "1") == 0, "plugin version 1");
    check(std::strcmp(c.getPluginNamespace(), "") == 0, "plugin namespace empty");
    PluginFieldCollection const* names = c.getFieldNames();
    check(names != nullptr && names->nbFields == 21, "21 field names (DeaMoEConfig's and the quantization's)");
    char const* expected[] = {"hidden_size", "num_departments", "experts_per_department", "shared_intermediate_size",
        "private_intermediate_size", "top_k", "top_departments", "score_func", "department_score", "norm_topk_prob",
        "routed_scaling_factor", "router_bias", "shared_expert_intermediate_size", "shared_expert_gate", "ffn_bias",
        "activation", "swiglu_alpha", "swiglu_limit", "router_logit_bias", "weight_bits", "weight_group_size"};
    for (int i = 0; i < 21 && names; ++i)
    {
        check(std::strcmp(names->fields[i].name, expected[i]) == 0, std::string("field ") + expected[i]);
    }
    check(names->fields[7].type == PluginFieldType::kCHAR, "score_func is kCHAR");
    check(names->fields[10].type == PluginFieldType::kFLOAT32, "routed_scaling_factor is kFLOAT32");
    check(names->fields[0].type == PluginFieldType::kINT32, "hidden_size is kINT32");
    check(names->fields[14].type == PluginFieldType::kINT32, "ffn_bias is kINT32");
    check(names->fields[15].type == PluginFieldType::kCHAR, "activation is kCHAR");
    check(names->fields[16].type == PluginFieldType::kFLOAT32, "swiglu_alpha is kFLOAT32");
    check(names->fields[17].type == PluginFieldType::kFLOAT32, "swiglu_limit is kFLOAT32");
    check(names->fields[18].type == PluginFieldType::kINT32, "router_logit_bias is kINT32");
    check(names->fields[19].type == PluginFieldType::kINT32, "weight_bits is kINT32");
    check(names->fields[20].type == PluginFieldType::kINT32, "weight_group_size is kINT32");
}

void testCreateFromParserFields()
{
    auto f = tinyFields();
    PluginPtr plugin = create(f);
    check(plugin != nullptr, "createPlugin from parser-style fields");
    if (!plugin)
    {
        return;
    }
    check(
        paramsOf(plugin.get()).find("d=64 D=4 m=4 f_s=32 f_p=16 k=4 g=2 score_func=softmax department_score=max") == 0,
        "fields mapped to LayerParams: " + paramsOf(plugin.get()));
    auto* core = static_cast<IPluginV3OneCore*>(plugin->getCapabilityInterface(PluginCapabilityType::kCORE));
    check(core != nullptr && std::strcmp(core->getPluginName(), "DeaMoE") == 0, "core capability");
    check(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD) != nullptr, "build capability");
    check(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME) != nullptr, "runtime capability");

    auto g = fullFields();
    PluginPtr full = create(g);
    check(full != nullptr, "createPlugin with every optional input");
    if (full)
    {
        check(paramsOf(full.get()).find("score_func=sigmoid department_score=sum_top2") != std::string::npos
                && paramsOf(full.get()).find("routed_scaling_factor=2.5 router_bias=1 f_sh=16 shared_expert_gate=1")
                    != std::string::npos,
            "optional fields mapped: " + paramsOf(full.get()));
    }

    // Other callers (Python API, older/newer parsers): int64 ints, strings without NUL.
    Fields h;
    h.i64("hidden_size", 64)
        .i64("num_departments", 4)
        .i64("experts_per_department", 4)
        .i64("shared_intermediate_size", 32)
        .i64("private_intermediate_size", 16)
        .i64("top_k", 4)
        .i64("top_departments", 2)
        .str("score_func", "sigmoid", false)
        .str("plugin_version", "1")
        .str("plugin_namespace", "");
    PluginPtr other = create(h);
    check(other != nullptr, "int64 fields, strings without NUL, defaults for optional fields");
    if (other)
    {
        check(paramsOf(other.get())
                    .find("score_func=sigmoid department_score=max norm_topk_prob=1 "
                          "routed_scaling_factor=1 router_bias=0 f_sh=0 shared_expert_gate=0")
                != std::string::npos,
            "defaults as DeaMoEConfig: " + paramsOf(other.get()));
    }
}

void testCreateRejects()
{
    struct Case
    {
        char const* what;
        Fields fields;
        char const* message;
    };
    std::vector<Case> cases;
    cases.push_back({"missing required field", tinyFields().without("top_k"), "missing field 'top_k'"});
    cases.push_back({"unknown field", tinyFields().i32("topk", 4), "unknown field 'topk'"});
    cases.push_back({"bad score_func", tinyFields().without("score_func").str("score_func", "relu"), "score_func"});
    cases.push_back({"bad department_score", tinyFields().without("department_score").str("department_score", "min"),
        "department_score"});
    cases.push_back({"bool out of range", tinyFields().without("router_bias").i32("router_bias", 2), "router_bias"});
    cases.push_back({"int as string", tinyFields().without("top_k").str("top_k", "4"), "top_k"});
    cases.push_back({"duplicate field", tinyFields().i32("top_k", 4), "twice"});
    cases.push_back({"invalid layer (k > g*m)", tinyFields().without("top_k").i32("top_k", 9), "invalid DeaMoE layer"});
    cases.push_back(
        {"the kernels' reason is passed on", tinyFields().without("top_k").i32("top_k", 9), "stub: top_k must be"});
    cases.push_back(
        {"int64 overflow", tinyFields().without("hidden_size").i64("hidden_size", int64_t{1} << 40), "int32"});
    cases.push_back({"weight_bits 3", quantFields(4, 16).without("weight_bits").i32("weight_bits", 3),
        "field 'weight_bits' must be 0 (float weights), 4 or 8, got 3"});
    cases.push_back({"group size 48", quantFields(4, 16).without("weight_group_size").i32("weight_group_size", 48),
        "field 'weight_group_size' must be 16, 32, 64 or 128 when weight_bits is 4, got 48"});
    cases.push_back({"group size 0 when quantized", quantFields(8, 16).without("weight_group_size"),
        "must be 16, 32, 64 or 128 when weight_bits is 8, got 0"});
    cases.push_back({"a width not a whole number of groups", quantFields(4, 64),
        "field 'hidden_size' is 32, not divisible by weight_group_size 64"});
    cases.push_back({"a group size in a float node", tinyFields().i32("weight_group_size", 32),
        "field 'weight_group_size' is 32 but weight_bits is 0"});
    for (auto& c : cases)
    {
        gFinder.logger.last.clear();
        PluginPtr plugin = create(c.fields);
        check(plugin == nullptr, std::string("rejects: ") + c.what);
        check(lastErrorHas(c.message), std::string("error names the problem (") + c.what + "): " + gFinder.logger.last);
    }
    gFinder.logger.last.clear();
    check(creator().createPlugin("x", nullptr, TensorRTPhase::kBUILD) == nullptr && lastErrorHas("no fields"),
        "null field collection is an error, not a crash");
}

void testSerialisationRoundTrip()
{
    for (auto f : {tinyFields(), fullFields(), quantFields(4, 16), quantFields(8, 32)})
    {
        PluginPtr plugin = create(f);
        if (!plugin)
        {
            check(false, "create for round trip");
            continue;
        }
        auto* runtime
            = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
        PluginFieldCollection const* fc = runtime->getFieldsToSerialize();
        check(fc != nullptr && fc->nbFields == 21, "21 serialized fields");
        PluginPtr back(creator().createPlugin("layer0", fc, TensorRTPhase::kRUNTIME));
        check(back != nullptr && paramsOf(back.get()) == paramsOf(plugin.get()),
            "serialized fields recreate the same layer: " + paramsOf(plugin.get()));
        for (int i = 0; fc && i < fc->nbFields; ++i)
        {
            if (std::strcmp(fc->fields[i].name, "score_func") == 0)
            {
                check(fc->fields[i].type == PluginFieldType::kCHAR, "score_func serialized as kCHAR");
            }
        }
    }
    // A clone outlives its original and serialises from its own storage.
    auto f = fullFields();
    PluginPtr plugin = create(f);
    PluginPtr copy(plugin ? plugin->clone() : nullptr);
    std::string const expected = plugin ? paramsOf(plugin.get()) : "";
    plugin.reset();
    if (copy)
    {
        auto* runtime = static_cast<IPluginV3OneRuntime*>(copy->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
        PluginPtr back(creator().createPlugin("layer0", runtime->getFieldsToSerialize(), TensorRTPhase::kRUNTIME));
        check(back != nullptr && paramsOf(back.get()) == expected, "clone serialises after the original is gone");
        PluginPtr attached(runtime->attachToContext(nullptr));
        check(attached != nullptr && paramsOf(attached.get()) == expected, "attachToContext returns a working clone");
    }
    else
    {
        check(false, "clone");
    }
}

void testTypesAndFormats()
{
    auto f = tinyFields();
    PluginPtr plugin = create(f);
    if (!plugin)
    {
        check(false, "create for types");
        return;
    }
    auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
    check(build->getNbOutputs() == 1, "one output");

    DataType in[6]
        = {DataType::kBF16, DataType::kBF16, DataType::kBF16, DataType::kBF16, DataType::kBF16, DataType::kBF16};
    DataType out[1] = {DataType::kFLOAT};
    check(build->getOutputDataTypes(out, 1, in, 6) == 0 && out[0] == DataType::kBF16, "output dtype = input 0's");
    gFinder.logger.last.clear();
    check(build->getOutputDataTypes(out, 1, in, 5) != 0 && lastErrorHas("need 6"), "wrong input count rejected");

    auto shapes = tinyShapes(-1);
    for (DataType type : {DataType::kFLOAT, DataType::kHALF, DataType::kBF16})
    {
        std::vector<DynamicPluginTensorDesc> io;
        for (auto const& s : shapes)
        {
            io.push_back(dyn(s, type));
        }
        io.push_back(dyn({-1, 64}, type));
        bool all = true;
        for (int32_t pos = 0; pos < 7; ++pos)
        {
            all = all && build->supportsFormatCombination(pos, io.data(), 6, 1);
        }
        check(all, "linear, all one float type: supported (type " + std::to_string(static_cast<int>(type)) + ")");
    }
    std::vector<DynamicPluginTensorDesc> io;
    for (auto const& s : shapes)
    {
        io.push_back(dyn(s, DataType::kHALF));
    }
    io.push_back(dyn({-1, 64}, DataType::kHALF));
    io[3].desc.type = DataType::kFLOAT;
    check(!build->supportsFormatCombination(3, io.data(), 6, 1), "mixed types rejected");
    io[3].desc.type = DataType::kHALF;
    io[0].desc.type = DataType::kINT8;
    check(!build->supportsFormatCombination(0, io.data(), 6, 1), "int8 rejected");
    io[0].desc.type = DataType::kHALF;
    io[2].desc.format = TensorFormat::kCHW2;
    check(!build->supportsFormatCombination(2, io.data(), 6, 1), "non-linear format rejected");
    check(!build->supportsFormatCombination(7, io.data(), 6, 1), "position out of range rejected");

    // The router keeps its own precision: router.bias float32, router.weight float32 or the
    // activation type, whatever the activations (full config: input 2 is router.bias).
    auto ff = fullFields();
    PluginPtr full = create(ff);
    auto* fb = static_cast<IPluginV3OneBuild*>(full->getCapabilityInterface(PluginCapabilityType::kBUILD));
    for (DataType type : {DataType::kHALF, DataType::kBF16})
    {
        std::vector<DynamicPluginTensorDesc> io2;
        for (auto const& s : fullShapes(-1))
        {
            io2.push_back(dyn(s, type));
        }
        io2.push_back(dyn({-1, 32}, type));
        io2[2].desc.type = DataType::kFLOAT;
        check(fb->supportsFormatCombination(2, io2.data(), 10, 1), "router.bias float32 in a half-precision node");
        io2[2].desc.type = type;
        check(!fb->supportsFormatCombination(2, io2.data(), 10, 1), "router.bias in the activation type rejected");
        io2[1].desc.type = DataType::kFLOAT;
        check(fb->supportsFormatCombination(1, io2.data(), 10, 1), "router.weight float32 accepted");
        io2[1].desc.type = type;
        check(fb->supportsFormatCombination(1, io2.data(), 10, 1), "router.weight in the activation type accepted");
        io2[3].desc.type = DataType::kFLOAT;
        check(!fb->supportsFormatCombination(3, io2.data(), 10, 1), "an FFN weight in float32 rejected");
    }
}

void testShapes()
{
    auto f = tinyFields();
    PluginPtr plugin = create(f);
    if (!plugin)
    {
        check(false, "create for shapes");
        return;
    }
    auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
    auto* runtime = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));

    // getOutputShapes passes hidden_states' expressions through; they are never dereferenced here.
    auto const* t = reinterpret_cast<IDimensionExpr const*>(uintptr_t{0x10});
    auto const* d = reinterpret_cast<IDimensionExpr const*>(uintptr_t{0x20});
    std::vector<DimsExprs> inputs(6);
    for (auto& e : inputs)
    {
        e.nbDims = 2;
        e.d[0] = t;
        e.d[1] = d;
    }
    DimsExprs output{};
    FakeExprBuilder builder;
    check(build->getOutputShapes(inputs.data(), 6, nullptr, 0, &output, 1, builder) == 0 && output.nbDims == 2
            && output.d[0] == t && output.d[1] == d,
        "output shape = hidden_states' shape");
    inputs[0].nbDims = 3;
    check(build->getOutputShapes(inputs.data(), 6, nullptr, 0, &output, 1, builder) != 0, "rank-3 hidden rejected");

    std::vector<DynamicPluginTensorDesc> in;
    for (auto const& s : tinyShapes(-1))
    {
        in.push_back(dyn(s));
    }
    DynamicPluginTensorDesc out = dyn({-1, 64});
    check(build->configurePlugin(in.data(), 6, &out, 1) == 0, "configurePlugin accepts the node's shapes");
    in[4] = dyn({16, 32, 65});
    gFinder.logger.last.clear();
    check(build->configurePlugin(in.data(), 6, &out, 1) != 0 && lastErrorHas("input 4 (experts.gate_up)"),
        "configurePlugin names a wrong weight shape: " + gFinder.logger.last);
    in[4] = dyn({16, 32, 64});
    in[0] = dyn({-1, 48});
    check(build->configurePlugin(in.data(), 6, &out, 1) != 0, "wrong hidden size rejected");
    in[0] = dyn({-1, 64});
    gSupportedResult = deamoe::Status::kUNSUPPORTED;
    gFinder.logger.last.clear();
    check(build->configurePlugin(in.data(), 6, &out, 1) != 0 && lastErrorHas("cannot run in")
            && lastErrorHas("must be a multiple of 99"),
        "configurePlugin reports the kernels' limit (deamoe::checkSupported): " + gFinder.logger.last);
    gSupportedResult = deamoe::Status::kSUCCESS;

    std::vector<PluginTensorDesc> rin;
    for (auto const& s : tinyShapes(3))
    {
        rin.push_back(desc(s));
    }
    PluginTensorDesc rout = desc({3, 64});
    check(runtime->onShapeChange(rin.data(), 6, &rout, 1) == 0, "onShapeChange accepts real shapes");
    rin[1] = desc({15, 64});
    check(runtime->onShapeChange(rin.data(), 6, &rout, 1) != 0, "onShapeChange rejects a wrong router shape");
}

void testWorkspaceAndEnqueue()
{
    auto f = fullFields();
    PluginPtr plugin = create(f);
    if (!plugin)
    {
        check(false, "create for enqueue");
        return;
    }
    auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
    auto* runtime = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));

    std::vector<DynamicPluginTensorDesc> in;
    for (auto const& s : fullShapes(-1))
    {
        in.push_back(dyn(s, DataType::kHALF, 1, 64));
    }
    DynamicPluginTensorDesc out = dyn({-1, 32}, DataType::kHALF, 1, 64);
    check(build->getWorkspaceSize(in.data(), 10, &out, 1) == 1000 + 64 * 32 * 2,
        "workspace = deamoe::workspaceSize for the profile's max tokens");

    std::vector<PluginTensorDesc> rin;
    for (auto const& s : fullShapes(5))
    {
        rin.push_back(desc(s, DataType::kHALF));
    }
    PluginTensorDesc rout = desc({5, 32}, DataType::kHALF);
    FakeBuffers buffers(10);
    void const* const* inputs = buffers.inputs.data();
    void* const* outputs = buffers.outputs;
    char workspace[4];
    gForward = ForwardCall{};
    int32_t rc = runtime->enqueue(rin.data(), &rout, inputs, outputs, workspace, nullptr);
    check(rc == 0 && gForward.calls == 1, "enqueue calls deamoe::forwardVariant once");
    if (std::getenv(deamoe::plugin::kVARIANT_TABLES_ENV) == nullptr)
    {
        check(gForward.variant == 0, "no variant table: the default variant");
    }
    deamoe::LayerWeights const& w = gForward.weights;
    check(gForward.hidden == inputs[0] && gForward.output == outputs[0], "hidden and output pointers");
    check(w.routerWeight == inputs[1] && w.routerBias == inputs[2] && w.departmentGateUp == inputs[3]
            && w.departmentDown == inputs[4] && w.expertGateUp == inputs[5] && w.expertDown == inputs[6]
            && w.sharedGateUp == inputs[7] && w.sharedDown == inputs[8] && w.sharedGate == inputs[9],
        "every node input lands on its LayerWeights field");
    check(gForward.numTokens == 5 && gForward.dtype == deamoe::DataType::kHALF && gForward.workspace == workspace
            && gForward.workspaceBytes == 1000 + 5 * 32 * 2,
        "tokens, dtype, workspace and its size for this step");

    // The tiny preset: no bias, no shared experts; the absent fields stay null.
    auto t = tinyFields();
    PluginPtr tiny = create(t);
    auto* trun = static_cast<IPluginV3OneRuntime*>(tiny->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    std::vector<PluginTensorDesc> tin;
    for (auto const& s : tinyShapes(2))
    {
        tin.push_back(desc(s, DataType::kFLOAT));
    }
    PluginTensorDesc tout = desc({2, 64}, DataType::kFLOAT);
    gForward = ForwardCall{};
    rc = trun->enqueue(tin.data(), &tout, inputs, outputs, workspace, nullptr);
    check(rc == 0 && gForward.weights.routerBias == nullptr && gForward.weights.sharedGateUp == nullptr
            && gForward.weights.sharedGate == nullptr && gForward.weights.departmentGateUp == inputs[2]
            && gForward.weights.expertDown == inputs[5] && gForward.dtype == deamoe::DataType::kFLOAT,
        "absent inputs are nullptr, present ones shift left");

    rin[0] = desc({0, 32}, DataType::kHALF);
    gForward = ForwardCall{};
    check(runtime->enqueue(rin.data(), &rout, inputs, outputs, workspace, nullptr) == 0 && gForward.calls == 0,
        "zero tokens: nothing launched");

    rin[0] = desc({5, 32}, DataType::kHALF);
    gForward = ForwardCall{};
    check(runtime->enqueue(rin.data(), &rout, inputs, outputs, workspace, nullptr) == 0
            && gForward.params.routerWeightFloat32 == 0,
        "a half-precision router.weight: params.routerWeightFloat32 = 0");
    rin[1].type = DataType::kFLOAT;
    rin[2].type = DataType::kFLOAT;
    check(runtime->enqueue(rin.data(), &rout, inputs, outputs, workspace, nullptr) == 0
            && gForward.params.routerWeightFloat32 == 1 && gForward.dtype == deamoe::DataType::kHALF,
        "a float32 router.weight in a float16 node: params.routerWeightFloat32 = 1");
    rin[1].type = DataType::kHALF;
    rin[2].type = DataType::kHALF;

    gForwardResult = deamoe::Status::kCUDA_ERROR;
    gFinder.logger.last.clear();
    check(runtime->enqueue(rin.data(), &rout, inputs, outputs, workspace, nullptr) != 0 && lastErrorHas("CUDA error")
            && lastErrorHas("stub launch failure"),
        "a failing kernel is reported with the CUDA error: " + gFinder.logger.last);

    // Attached to an execution context, enqueue failures also reach its error recorder.
    FakeErrorRecorder recorder;
    FakeResourceContext context;
    context.recorder = &recorder;
    PluginPtr attached(runtime->attachToContext(&context));
    auto* arun = static_cast<IPluginV3OneRuntime*>(attached->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    check(arun->enqueue(rin.data(), &rout, inputs, outputs, workspace, nullptr) != 0 && recorder.getNbErrors() == 1
            && recorder.getErrorCode(0) == ErrorCode::kFAILED_EXECUTION
            && std::string(recorder.getErrorDesc(0)).find("stub launch failure") != std::string::npos,
        "the error recorder of the attached context gets the failure");
    PluginPtr detached(runtime->attachToContext(nullptr));
    gForwardResult = deamoe::Status::kSUCCESS;
}

void testQuantized()
{
    for (int32_t bits : {4, 8})
    {
        std::string const tag = " (int" + std::to_string(bits) + ")";
        auto f = quantFields(bits, 16);
        PluginPtr plugin = create(f);
        check(plugin != nullptr, "createPlugin for a quantized node" + tag + ": " + gFinder.logger.last);
        if (!plugin)
        {
            continue;
        }
        check(paramsOf(plugin.get()).find("weight_bits=" + std::to_string(bits) + " weight_group_size=16")
                != std::string::npos,
            "weight_bits/weight_group_size mapped to LayerParams: " + paramsOf(plugin.get()));
        auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
        auto* runtime
            = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));

        // Types: codes int32 words, scales in the activation type, router.bias float32.
        for (DataType type : {DataType::kFLOAT, DataType::kHALF, DataType::kBF16})
        {
            std::vector<DynamicPluginTensorDesc> io;
            auto const shapes = quantShapes(-1, bits, 16);
            for (size_t i = 0; i < shapes.size(); ++i)
            {
                io.push_back(dyn(shapes[i], quantType(i, type)));
            }
            io.push_back(dyn({-1, 32}, type));
            bool all = true;
            for (int32_t pos = 0; pos < 17; ++pos)
            {
                all = all && build->supportsFormatCombination(pos, io.data(), 16, 1);
            }
            check(all, "int32 codes, scales in the node's type: supported" + tag);
            DataType out[1] = {DataType::kFLOAT};
            std::vector<DataType> in;
            for (auto const& d : io)
            {
                in.push_back(d.desc.type);
            }
            check(build->getOutputDataTypes(out, 1, in.data(), 16) == 0 && out[0] == type,
                "output dtype = hidden_states' in a quantized node" + tag);
            check(build->configurePlugin(io.data(), 16, &io[16], 1) == 0,
                "configurePlugin accepts the quantized node's inputs" + tag + ": " + gFinder.logger.last);
            io[5].desc.type = type;
            check(!build->supportsFormatCombination(5, io.data(), 16, 1), "codes in a float type rejected" + tag);
            io[5].desc.type = DataType::kINT8;
            check(!build->supportsFormatCombination(5, io.data(), 16, 1), "codes as int8 rejected" + tag);
            io[5].desc.type = DataType::kINT32;
            io[12].desc.type = DataType::kINT32;
            check(!build->supportsFormatCombination(12, io.data(), 16, 1), "int32 scales rejected" + tag);
        }

        // Shapes and types are checked when configured, each failure naming the input.
        std::vector<DynamicPluginTensorDesc> in;
        auto const shapes = quantShapes(-1, bits, 16);
        for (size_t i = 0; i < shapes.size(); ++i)
        {
            in.push_back(dyn(shapes[i], quantType(i, DataType::kHALF)));
        }
        DynamicPluginTensorDesc out = dyn({-1, 32});
        check(build->configurePlugin(in.data(), 15, &out, 1) != 0 && lastErrorHas("need 16"),
            "a quantized node without its last scale input rejected" + tag + ": " + gFinder.logger.last);
        in[5] = dyn({8, 64, 32}, DataType::kINT32);
        gFinder.logger.last.clear();
        check(build->configurePlugin(in.data(), 16, &out, 1) != 0 && lastErrorHas("input 5 (experts.gate_up)")
                && lastErrorHas(deamoe::plugin::shapeString({8, 64, 32 * bits / 32})),
            "unpacked codes shape rejected, the packed one named" + tag + ": " + gFinder.logger.last);
        in[5] = dyn(shapes[5], DataType::kHALF);
        gFinder.logger.last.clear();
        check(build->configurePlugin(in.data(), 16, &out, 1) != 0
                && lastErrorHas("input 5 (experts.gate_up) is float16") && lastErrorHas("int32 words of packed codes"),
            "float codes rejected, the codes type named" + tag + ": " + gFinder.logger.last);
        in[5] = dyn(shapes[5], DataType::kINT32);
        in[13] = dyn({8, 32, 1});
        gFinder.logger.last.clear();
        check(build->configurePlugin(in.data(), 16, &out, 1) != 0 && lastErrorHas("input 13 (experts.down.scales)"),
            "wrong scales shape rejected" + tag + ": " + gFinder.logger.last);

        // enqueue: codes and scales land on their LayerWeights members, the quantization in params.
        std::vector<PluginTensorDesc> rin;
        auto const real = quantShapes(3, bits, 16);
        for (size_t i = 0; i < real.size(); ++i)
        {
            rin.push_back(desc(real[i], quantType(i, DataType::kHALF)));
        }
        PluginTensorDesc rout = desc({3, 32});
        check(runtime->onShapeChange(rin.data(), 16, &rout, 1) == 0,
            "onShapeChange accepts the quantized node" + tag + ": " + gFinder.logger.last);
        FakeBuffers buffers(16);
        void const* const* inputs = buffers.inputs.data();
        char workspace[4];
        gForward = ForwardCall{};
        check(runtime->enqueue(rin.data(), &rout, inputs, buffers.outputs, workspace, nullptr) == 0
                && gForward.calls == 1,
            "enqueue runs a quantized node" + tag);
        deamoe::LayerWeights const& w = gForward.weights;
        check(w.departmentGateUp == inputs[3] && w.expertDown == inputs[6] && w.sharedDown == inputs[8]
                && w.sharedGate == inputs[9] && w.departmentGateUpScales == inputs[10]
                && w.departmentDownScales == inputs[11] && w.expertGateUpScales == inputs[12]
                && w.expertDownScales == inputs[13] && w.sharedGateUpScales == inputs[14]
                && w.sharedDownScales == inputs[15],
            "codes and scales land on their LayerWeights members" + tag);
        check(gForward.params.weightBits == bits && gForward.params.weightGroupSize == 16
                && gForward.dtype == deamoe::DataType::kHALF,
            "forward gets weightBits/weightGroupSize" + tag);
    }

    // A float node's scales are nullptr and its params say float: what engines built before
    // the quantization fields existed (no weight_bits/weight_group_size fields) read back as.
    auto f = fullFields();
    PluginPtr plugin = create(f);
    check(plugin != nullptr && paramsOf(plugin.get()).find("weight_bits=0 weight_group_size=0") != std::string::npos,
        "a node without the quantization fields is float");
}

void testBiased()
{
    auto f = gptOssFields();
    PluginPtr plugin = create(f);
    check(plugin != nullptr, "createPlugin for a gpt-oss node: " + gFinder.logger.last);
    if (!plugin)
    {
        return;
    }
    check(paramsOf(plugin.get())
                .find("ffn_bias=1 activation=swiglu_clamped swiglu_alpha=1.702 swiglu_limit=1 router_logit_bias=1")
            != std::string::npos,
        "ffn_bias, activation, swiglu_alpha/limit and router_logit_bias mapped: " + paramsOf(plugin.get()));
    auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
    auto* runtime = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    PluginPtr back(creator().createPlugin("layer0", runtime->getFieldsToSerialize(), TensorRTPhase::kRUNTIME));
    check(back != nullptr && paramsOf(back.get()) == paramsOf(plugin.get()),
        "a gpt-oss node's serialized fields recreate it: " + paramsOf(plugin.get()));

    // Types: router.logit_bias float32 (as router.bias), the FFN biases the node's type.
    auto const shapes = gptOssShapes(-1);
    int32_t const n = static_cast<int32_t>(shapes.size());
    std::vector<DynamicPluginTensorDesc> io;
    for (int32_t i = 0; i < n; ++i)
    {
        io.push_back(dyn(shapes[i], i == 8 ? DataType::kFLOAT : DataType::kBF16));
    }
    io.push_back(dyn({-1, 32}, DataType::kBF16));
    bool all = true;
    for (int32_t pos = 0; pos <= n; ++pos)
    {
        all = all && build->supportsFormatCombination(pos, io.data(), n, 1);
    }
    check(all, "a float32 logit bias and biases in the node's type: supported");
    io[8].desc.type = DataType::kBF16;
    check(!build->supportsFormatCombination(8, io.data(), n, 1), "a bf16 router.logit_bias rejected");
    io[8].desc.type = DataType::kFLOAT;
    io[11].desc.type = DataType::kFLOAT;
    check(!build->supportsFormatCombination(11, io.data(), n, 1), "a float32 expert down bias in a bf16 node rejected");
    io[11].desc.type = DataType::kBF16;
    check(build->configurePlugin(io.data(), n, &io[n], 1) == 0,
        "configurePlugin accepts the gpt-oss node's inputs: " + gFinder.logger.last);
    io[11] = dyn({16, 16}, DataType::kBF16);
    gFinder.logger.last.clear();
    check(build->configurePlugin(io.data(), n, &io[n], 1) != 0 && lastErrorHas("input 11 (experts.down_bias)")
            && lastErrorHas(deamoe::plugin::shapeString({16, 32})),
        "a wrong bias shape rejected, the input and its shape named: " + gFinder.logger.last);

    // enqueue: each bias lands on its LayerWeights member.
    std::vector<PluginTensorDesc> rin;
    auto const real = gptOssShapes(3);
    for (size_t i = 0; i < real.size(); ++i)
    {
        rin.push_back(desc(real[i], i == 8 ? DataType::kFLOAT : DataType::kHALF));
    }
    PluginTensorDesc rout = desc({3, 32});
    FakeBuffers buffers(real.size());
    void const* const* inputs = buffers.inputs.data();
    char workspace[4];
    gForward = ForwardCall{};
    check(runtime->enqueue(rin.data(), &rout, inputs, buffers.outputs, workspace, nullptr) == 0 && gForward.calls == 1,
        "enqueue runs a gpt-oss node");
    deamoe::LayerWeights const& w = gForward.weights;
    check(w.sharedDown == inputs[7] && w.routerBias == nullptr && w.sharedGate == nullptr
            && w.routerLogitBias == inputs[8] && w.departmentGateUpBias == inputs[9] && w.expertGateUpBias == inputs[10]
            && w.expertDownBias == inputs[11] && w.sharedGateUpBias == inputs[12] && w.sharedDownBias == inputs[13],
        "the logit bias and the FFN biases land on their LayerWeights members");
    check(gForward.params.ffnBias == 1 && gForward.params.hasRouterLogitBias == 1
            && gForward.params.activation == deamoe::Activation::kSWIGLU_CLAMPED && gForward.params.swigluLimit == 1.0F,
        "forward gets the biases' flags and the activation");

    // Nodes and engines written before these fields existed read as the layer without them.
    auto t = tinyFields();
    PluginPtr tiny = create(t);
    check(tiny != nullptr
            && paramsOf(tiny.get())
                    .find("ffn_bias=0 activation=swiglu swiglu_alpha=1.702 swiglu_limit=7 "
                          "router_logit_bias=0")
                != std::string::npos,
        "a node without the new fields has no biases and the plain SwiGLU: " + (tiny ? paramsOf(tiny.get()) : ""));
    auto bad = gptOssFields().without("activation").str("activation", "gelu");
    gFinder.logger.last.clear();
    check(create(bad) == nullptr && lastErrorHas("field 'activation' must be 'swiglu' or 'swiglu_clamped', got 'gelu'"),
        "an unknown activation rejected: " + gFinder.logger.last);
}

} // namespace

// A plugin of fullFields' layer enqueued with `tokens` fp16 tokens: the variant it ran.
int32_t variantAt(int64_t tokens)
{
    auto f = fullFields();
    PluginPtr plugin = create(f);
    if (!plugin)
    {
        return -1;
    }
    auto* runtime = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    std::vector<PluginTensorDesc> rin;
    for (auto const& s : fullShapes(tokens))
    {
        rin.push_back(desc(s, DataType::kHALF));
    }
    PluginTensorDesc rout = desc({tokens, 32}, DataType::kHALF);
    FakeBuffers buffers(10);
    char workspace[4];
    gForward = ForwardCall{};
    int32_t const rc = runtime->enqueue(rin.data(), &rout, buffers.inputs.data(), buffers.outputs, workspace, nullptr);
    return rc == 0 && gForward.calls == 1 ? gForward.variant : -1;
}

// The plugin's copy of tuning.py's names (tests/plugins/deamoe/test_plugin_cpp.py checks the
// same against tuning.py), its tiles, and what a broken or absent table does.
void testVariantTableReading()
{
    using deamoe::plugin::variantTableFileName;
    check(variantTableFileName("NVIDIA H200") == "NVIDIA_H200.json"
            && variantTableFileName(" NVIDIA A100-SXM4-80GB ") == "NVIDIA_A100_SXM4_80GB.json"
            && variantTableFileName("--").empty(),
        "table file names: runs of other characters one underscore, none at the ends");
    check(deamoe::plugin::tileIndex(1) == 0 && deamoe::plugin::tileIndex(3) == 2 && deamoe::plugin::tileIndex(16) == 4
            && deamoe::plugin::tileIndex(40) == 4,
        "token counts map to the kernels' tiles");

    char const* const saved = std::getenv(deamoe::plugin::kVARIANT_TABLES_ENV);
    std::string const savedValue = saved ? saved : "";
    char dir[] = "/tmp/deamoe_harness_XXXXXX";
    if (mkdtemp(dir) == nullptr)
    {
        check(false, "a temporary folder for a table");
        return;
    }
    setenv(deamoe::plugin::kVARIANT_TABLES_ENV, dir, 1);
    std::string const path = std::string(dir) + "/Harness_GPU_1.json";
    {
        std::FILE* file = std::fopen(path.c_str(), "w");
        std::fputs("{\"device\": \"Harness GPU (1)\", \"entries\": [{\"shape\": 1}]}", file);
        std::fclose(file);
    }
    gFinder.logger.last.clear();
    check(variantAt(1) == 0 && lastErrorHas("entry 0 needs shape, dtype, bits, tokens and variant")
            && lastErrorHas("running the default kernel variant"),
        "a malformed table: the default variant, the problem logged: " + gFinder.logger.last);
    {
        std::FILE* file = std::fopen(path.c_str(), "w");
        std::fputs("{\"device\": \"Harness GPU (1)\", \"entries\": [", file);
        std::fclose(file);
    }
    check(variantAt(1) == 0 && lastErrorHas("not valid JSON"), "truncated JSON: the default variant, logged");
    std::remove(path.c_str());
    check(variantAt(1) == 0, "no file for this GPU: the default variant");
    rmdir(dir);
    if (saved)
    {
        setenv(deamoe::plugin::kVARIANT_TABLES_ENV, savedValue.c_str(), 1);
    }
    else
    {
        unsetenv(deamoe::plugin::kVARIANT_TABLES_ENV);
    }
}

// DEAMOE_HARNESS_EXPECT="tokens:id,...": the variants a table written by tuning.py (in the
// folder DEAMOE_TRT_KERNEL_TABLES names) must make the plugin run (test_plugin_cpp.py).
void testVariantsFromTable()
{
    char const* expect = std::getenv("DEAMOE_HARNESS_EXPECT");
    if (expect == nullptr)
    {
        return;
    }
    std::string spec(expect);
    size_t pos = 0;
    int cases = 0;
    while (pos < spec.size())
    {
        size_t const comma = spec.find(',', pos);
        std::string const item = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        size_t const colon = item.find(':');
        int64_t const tokens = std::stoll(item.substr(0, colon));
        int32_t const id = std::stoi(item.substr(colon + 1));
        int32_t const got = variantAt(tokens);
        check(got == id,
            "tuning.py's table: " + std::to_string(tokens) + " token(s) run variant " + std::to_string(id) + ", got "
                + std::to_string(got));
        ++cases;
        pos = comma == std::string::npos ? spec.size() : comma + 1;
    }
    check(cases > 0, "DEAMOE_HARNESS_EXPECT lists cases");
}

int main()
{
    setLoggerFinder(&gFinder);
    testCreatorIdentity();
    testCreateFromParserFields();
    testCreateRejects();
    testSerialisationRoundTrip();
    testTypesAndFormats();
    testShapes();
    testWorkspaceAndEnqueue();
    testQuantized();
    testBiased();
    testVariantTableReading();
    testVariantsFromTable();
    std::printf("%d passed, %d failed\n", gPassed, gFailed);
    return gFailed == 0 ? 0 : 1;
}
