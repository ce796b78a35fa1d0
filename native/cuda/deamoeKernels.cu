/*
 * The public API of deamoeKernels.h: validation, workspace layout, dtype dispatch, error
 * reporting and the C ABI. The kernels live in deamoeForward.cuh (instantiated per dtype
 * in deamoeForward{Float,Half,Bf16}.cu).
 */
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime_api.h>

#include "deamoeInternal.h"

namespace deamoe
{
namespace detail
{

static_assert(::deamoe::kMaxTileTokens == kMaxTileTokens, "one tile size for the API and the kernels");
static_assert(sizeof(PlanEntry) == 12, "plan entries are packed (token, slot, weight)");

namespace
{

thread_local char tLastError[512] = "";

// On by default (it only takes effect on sm_90+); DEAMOE_PROGRAMMATIC_LAUNCH=0 turns it off.
bool programmaticLaunchFromEnvironment()
{
    char const* value = std::getenv("DEAMOE_PROGRAMMATIC_LAUNCH");
    return !value || value[0] != '0';
}

std::atomic<bool> gProgrammaticLaunch{programmaticLaunchFromEnvironment()};

// Compute capability major per device, -1 until queried (queries are legal during capture).
constexpr int kMaxDevices = 64;
std::atomic<int> gDeviceMajor[kMaxDevices];

size_t alignUp(size_t value)
{
    return (value + kAlign - 1) / kAlign * kAlign;
}

int elementBytes(DataType dtype)
{
    return dtype == DataType::kFLOAT ? 4 : 2;
}

char const* dtypeName(DataType dtype)
{
    switch (dtype)
    {
    case DataType::kFLOAT: return "float32";
    case DataType::kHALF: return "float16";
    case DataType::kBF16: return "bfloat16";
    }
    return "unknown";
}

TypedOps const* opsFor(DataType dtype)
{
    switch (dtype)
    {
    case DataType::kFLOAT: return &typedOpsFloat();
    case DataType::kHALF: return &typedOpsHalf();
    case DataType::kBF16: return &typedOpsBf16();
    }
    return nullptr;
}

bool aligned16(void const* p)
{
    return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

void clearError()
{
    tLastError[0] = '\0';
}

// A width a weight row runs along (the config's name for it, its value).
struct Width
{
    char const* name;
    int32_t value;
};

// The four widths weight rows run along: d (gate/up) and each part's width (down).
struct Widths
{
    Width items[4];
    explicit Widths(LayerParams const& p)
        : items{{"hidden_size", p.hidden}, {"shared_intermediate_size", p.sharedWidth},
              {"private_intermediate_size", p.privateWidth}, {"shared_expert_intermediate_size", p.sharedExpertWidth}}
    {
    }
    Width const* begin() const { return items; }
    Width const* end() const { return items + 4; }
};

// The kernels read every row with 16-byte loads: each row length must be a whole number
// of 16-byte chunks and each tensor 16-byte aligned.
Status checkVectorizable(LayerParams const& p, DataType dtype)
{
    int const elems = 16 / elementBytes(dtype);
    Widths const sizes(p);
    for (Width const& s : sizes)
    {
        if (s.value % elems != 0)
            return fail(Status::kUNSUPPORTED, "%s %d must be a multiple of %d for %s (16-byte rows)", s.name, s.value,
                elems, dtypeName(dtype));
    }
    // Quantized FFN weights: a row of codes of each width (d for gate/up, the part's width
    // for down) is read in 16-byte chunks of 32 int4 or 16 int8 codes too.
    if (p.weightBits > 0)
    {
        int const columns = 128 / p.weightBits;
        for (Width const& s : sizes)
        {
            if (s.value % columns != 0)
                return fail(Status::kUNSUPPORTED,
                    "%s %d must be a multiple of %d for int%d weights (rows of whole 16-byte vectors of codes)", s.name,
                    s.value, columns, p.weightBits);
        }
    }
    return Status::kSUCCESS;
}

Status checkPointer(void const* p, char const* name, bool needsAlignment = true)
{
    if (!p)
        return fail(Status::kINVALID_ARGUMENT, "%s is null", name);
    if (needsAlignment && !aligned16(p))
        return fail(Status::kUNSUPPORTED, "%s must be 16-byte aligned", name);
    return Status::kSUCCESS;
}

Status checkDtype(int32_t dtype)
{
    if (dtype < 0 || dtype > 2)
        return fail(Status::kUNSUPPORTED, "dtype %d is not one of 0 (float32), 1 (float16), 2 (bfloat16)", dtype);
    return Status::kSUCCESS;
}

Status checkOutputs(RoutingOutputs const& out)
{
    if (!out.expertIds || !out.weights || !out.departmentIds || !out.keptDepartments)
        return fail(Status::kINVALID_ARGUMENT, "routing outputs must all be non-null");
    return Status::kSUCCESS;
}

#define DEAMOE_RETURN_IF_FAILED(expr)                                                                                  \
    do                                                                                                                 \
    {                                                                                                                  \
        Status const status_ = (expr);                                                                                 \
        if (status_ != Status::kSUCCESS)                                                                               \
            return status_;                                                                                            \
    } while (0)

} // namespace

Status fail(Status status, char const* format, ...) noexcept
{
    va_list args;
    va_start(args, format);
    std::vsnprintf(tLastError, sizeof(tLastError), format, args);
    va_end(args);
    return status;
}

bool programmaticLaunchUsable() noexcept
{
    if (!gProgrammaticLaunch.load(std::memory_order_relaxed))
        return false;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices)
        return false;
    int major = gDeviceMajor[device].load(std::memory_order_relaxed);
    if (major <= 0)
    {
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
            return false;
        gDeviceMajor[device].store(major, std::memory_order_relaxed);
    }
    return major >= 9;
}

Status checkLaunch(char const* what, cudaError_t launched) noexcept
{
    if (launched == cudaSuccess)
        return Status::kSUCCESS;
    // The launch's error is ours: clear it. An error some earlier, unrelated call left
    // pending is not ours to report or clear, so a successful launch touches nothing.
    (void) cudaGetLastError();
    return fail(Status::kCUDA_ERROR, "%s: %s (%s)", what, cudaGetErrorName(launched), cudaGetErrorString(launched));
}

size_t routedSmemBytes(LayerParams const& p)
{
    return sizeof(uint32_t) * planScratchWords(planConfig(p))
        + sizeof(float) * static_cast<size_t>(routingScratchFloats(routingConfig(p))) * kGemvWarps;
}

RoutingConfig routingConfig(LayerParams const& p)
{
    return RoutingConfig{p.numDepartments * p.expertsPerDepartment, p.numDepartments, p.expertsPerDepartment, p.topK,
        p.topDepartments, static_cast<int32_t>(p.scoreFunc), static_cast<int32_t>(p.departmentScore),
        p.normTopkProb ? 1 : 0, p.routedScalingFactor};
}

PlanConfig planConfig(LayerParams const& p)
{
    return PlanConfig{
        p.numDepartments * p.expertsPerDepartment, p.numDepartments, p.expertsPerDepartment, p.topK, p.topDepartments};
}

WorkspaceLayout workspaceLayout(LayerParams const& p, int32_t tileTokens)
{
    WorkspaceLayout L{};
    int const tile = std::max(1, std::min(tileTokens, kMaxTileTokens));
    PlanConfig const pc = planConfig(p);
    size_t const N = static_cast<size_t>(pc.numExperts);
    size_t const d = static_cast<size_t>(p.hidden);
    L.tileTokens = tile;
    L.maxDepartmentParts = maxDepartmentParts(pc, tile);
    L.maxExpertParts = maxExpertParts(pc, tile);
    L.departmentSlotsPerToken = std::min(p.topDepartments, p.topK);
    L.logitsStride = pc.numExperts + 1;
    L.downTiles = (p.hidden + kDownRowsPerTile - 1) / kDownRowsPerTile;

    size_t offset = 0;
    auto take = [&offset](size_t bytes) {
        size_t const at = offset;
        offset += alignUp(bytes);
        return at;
    };
    L.logits = take(sizeof(float) * tile * (N + 1));
    L.routeBytes = offset;
    L.counts = take(sizeof(int32_t) * 2);
    L.departments = take(sizeof(int32_t) * L.maxDepartmentParts);
    L.experts = take(sizeof(int32_t) * L.maxExpertParts);
    L.departmentEntryCounts = take(sizeof(int32_t) * L.maxDepartmentParts);
    L.expertEntryCounts = take(sizeof(int32_t) * L.maxExpertParts);
    L.departmentEntries = take(sizeof(PlanEntry) * kMaxTileTokens * L.maxDepartmentParts);
    L.expertEntries = take(sizeof(PlanEntry) * kMaxTileTokens * L.maxExpertParts);
    L.departmentSlots = take(sizeof(int32_t) * kMaxTileTokens);
    L.counters = take(sizeof(int32_t) * kNumCounters);
    L.expertIds = take(sizeof(int32_t) * tile * p.topK);
    L.routingWeights = take(sizeof(float) * tile * p.topK);
    L.departmentIds = take(sizeof(int32_t) * tile * p.topK);
    L.keptDepartments = take(sizeof(int32_t) * tile * p.topDepartments);
    L.hShared = take(sizeof(float) * tile * static_cast<size_t>(p.sharedExpertWidth));
    L.hDepartment = take(sizeof(float) * tile * L.departmentSlotsPerToken * static_cast<size_t>(p.sharedWidth));
    L.hExpert = take(sizeof(float) * tile * p.topK * static_cast<size_t>(p.privateWidth));
    L.sharedOut = take(sizeof(float) * tile * (p.sharedExpertWidth ? d : 0));
    L.forwardBytes = offset;
    return L;
}

// Weight-only quantization (docs/quantization.md): what QuantConfig and check_quantizable
// accept. One line naming the limit otherwise.
Status validateQuantization(LayerParams const& p) noexcept
{
    if (p.weightBits == 0)
    {
        if (p.weightGroupSize != 0)
            return fail(Status::kINVALID_PARAMS, "weight_group_size must be 0 when weight_bits is 0, got %d",
                p.weightGroupSize);
        return Status::kSUCCESS;
    }
    if (p.weightBits != 4 && p.weightBits != 8)
        return fail(Status::kINVALID_PARAMS, "weight_bits must be 0 (float), 4 or 8, got %d", p.weightBits);
    int32_t const g = p.weightGroupSize;
    if (g != 16 && g != 32 && g != 64 && g != 128)
        return fail(Status::kINVALID_PARAMS, "weight_group_size must be 16, 32, 64 or 128 for int%d weights, got %d",
            p.weightBits, g);
    for (Width const& w : Widths(p))
    {
        if (w.value % g != 0)
            return fail(Status::kINVALID_PARAMS, "%s %d is not divisible by weight_group_size %d", w.name, w.value, g);
    }
    return Status::kSUCCESS;
}

} // namespace detail

using detail::fail;

char const* statusString(Status status) noexcept
{
    switch (status)
    {
    case Status::kSUCCESS: return "success";
    case Status::kINVALID_PARAMS: return "invalid layer parameters";
    case Status::kINVALID_ARGUMENT: return "invalid argument";
    case Status::kUNSUPPORTED: return "unsupported by this build";
    case Status::kCUDA_ERROR: return "CUDA error";
    }
    return "unknown status";
}

char const* lastErrorMessage() noexcept
{
    return detail::tLastError;
}

void setProgrammaticLaunch(bool enabled) noexcept
{
    detail::gProgrammaticLaunch.store(enabled);
}

bool programmaticLaunch() noexcept
{
    return detail::gProgrammaticLaunch.load();
}

Status validate(LayerParams const& p) noexcept
{
    detail::clearError();
    struct Field
    {
        char const* name;
        int32_t value;
        int32_t minimum;
    };
    Field const fields[] = {{"hidden_size", p.hidden, 1}, {"num_departments", p.numDepartments, 1},
        {"experts_per_department", p.expertsPerDepartment, 1}, {"top_k", p.topK, 1},
        {"top_departments", p.topDepartments, 1}, {"shared_intermediate_size", p.sharedWidth, 0},
        {"private_intermediate_size", p.privateWidth, 0}, {"shared_expert_intermediate_size", p.sharedExpertWidth, 0}};
    for (auto const& f : fields)
    {
        if (f.value < f.minimum)
            return fail(Status::kINVALID_PARAMS, "%s must be an integer >= %d, got %d", f.name, f.minimum, f.value);
    }
    struct Flag
    {
        char const* name;
        int32_t value;
    };
    Flag const flags[] = {{"norm_topk_prob", p.normTopkProb}, {"router_bias", p.hasRouterBias},
        {"shared_expert_gate", p.sharedExpertGate}, {"ffn_bias", p.ffnBias},
        {"router_logit_bias", p.hasRouterLogitBias}, {"router_weight_float32", p.routerWeightFloat32}};
    for (auto const& f : flags)
    {
        if (f.value != 0 && f.value != 1)
            return fail(Status::kINVALID_PARAMS, "%s must be 0 or 1, got %d", f.name, f.value);
    }
    if (p.sharedWidth == 0 && p.privateWidth == 0)
        return fail(Status::kINVALID_PARAMS,
            "shared_intermediate_size and private_intermediate_size are both 0; at least one must be >= 1");
    int32_t const scoreFunc = static_cast<int32_t>(p.scoreFunc);
    if (scoreFunc != 0 && scoreFunc != 1)
        return fail(Status::kINVALID_PARAMS, "score_func must be 0 (softmax) or 1 (sigmoid), got %d", scoreFunc);
    int32_t const departmentScore = static_cast<int32_t>(p.departmentScore);
    if (departmentScore < 0 || departmentScore > 2)
        return fail(Status::kINVALID_PARAMS, "department_score must be 0 (max), 1 (sum_top2) or 2 (sum), got %d",
            departmentScore);
    if (p.departmentScore == DepartmentScore::kSUM_TOP2 && p.expertsPerDepartment < 2)
        return fail(Status::kINVALID_PARAMS,
            "department_score 'sum_top2' needs experts_per_department >= 2, got %d; use 'max' or 'sum'",
            p.expertsPerDepartment);
    if (p.topDepartments > p.numDepartments)
        return fail(Status::kINVALID_PARAMS, "top_departments must be <= num_departments (%d), got %d",
            p.numDepartments, p.topDepartments);
    long long const room = static_cast<long long>(p.topDepartments) * p.expertsPerDepartment;
    if (p.topK > room)
        return fail(Status::kINVALID_PARAMS, "top_k must be <= top_departments * experts_per_department (%lld), got %d",
            room, p.topK);
    if (static_cast<long long>(p.numDepartments) * p.expertsPerDepartment > (1 << 24))
        return fail(Status::kINVALID_PARAMS, "num_departments * experts_per_department is too large");
    if (!std::isfinite(p.routedScalingFactor) || p.routedScalingFactor <= 0.0f)
        return fail(Status::kINVALID_PARAMS, "routed_scaling_factor must be a finite number > 0, got %g",
            static_cast<double>(p.routedScalingFactor));
    if (p.sharedExpertGate && p.sharedExpertWidth == 0)
        return fail(Status::kINVALID_PARAMS,
            "shared_expert_gate is 1 but shared_expert_intermediate_size is 0; set both or neither");
    int32_t const activation = static_cast<int32_t>(p.activation);
    if (activation != 0 && activation != 1)
        return fail(Status::kINVALID_PARAMS, "activation must be 0 (swiglu) or 1 (swiglu_clamped), got %d", activation);
    struct Positive
    {
        char const* name;
        float value;
    };
    for (Positive const& f : {Positive{"swiglu_alpha", p.swigluAlpha}, Positive{"swiglu_limit", p.swigluLimit}})
    {
        if (!std::isfinite(f.value) || f.value <= 0.0f)
            return fail(Status::kINVALID_PARAMS, "%s must be a finite number > 0, got %g", f.name,
                static_cast<double>(f.value));
    }
    if (p.ffnBias && p.privateWidth == 0)
        return fail(Status::kINVALID_PARAMS,
            "ffn_bias needs private_intermediate_size >= 1 (each expert keeps its own down bias)");
    return detail::validateQuantization(p);
}

size_t workspaceSize(LayerParams const& params, int32_t maxTokens, DataType dtype) noexcept
{
    (void) dtype; // intermediates are float32 whatever the dtype
    if (validate(params) != Status::kSUCCESS)
        return 0;
    return detail::workspaceLayout(params, maxTokens).forwardBytes;
}

Status routerLogits(LayerParams const& params, DataType dtype, void const* hidden, void const* routerWeight,
    void const* routerLogitBias, int32_t numTokens, float* logits, cudaStream_t stream) noexcept
{
    DEAMOE_RETURN_IF_FAILED(validate(params));
    DEAMOE_RETURN_IF_FAILED(detail::checkDtype(static_cast<int32_t>(dtype)));
    if (numTokens < 0)
        return fail(Status::kINVALID_ARGUMENT, "num_tokens must be >= 0, got %d", numTokens);
    if (numTokens == 0)
        return Status::kSUCCESS;
    DEAMOE_RETURN_IF_FAILED(detail::checkVectorizable(params, dtype));
    DEAMOE_RETURN_IF_FAILED(detail::checkPointer(hidden, "hidden"));
    DEAMOE_RETURN_IF_FAILED(detail::checkPointer(routerWeight, "router weight"));
    if (params.hasRouterLogitBias)
        DEAMOE_RETURN_IF_FAILED(detail::checkPointer(routerLogitBias, "router logit bias", false));
    DEAMOE_RETURN_IF_FAILED(detail::checkPointer(logits, "logits", false));
    return detail::opsFor(dtype)->routerLogits(
        params, hidden, routerWeight, routerLogitBias, numTokens, logits, stream);
}

Status routeLogits(LayerParams const& params, DataType dtype, float const* logits, void const* routerBias,
    int32_t numTokens, RoutingOutputs const& out, cudaStream_t stream) noexcept
{
    DEAMOE_RETURN_IF_FAILED(validate(params));
    DEAMOE_RETURN_IF_FAILED(detail::checkDtype(static_cast<int32_t>(dtype)));
    if (numTokens < 0)
        return fail(Status::kINVALID_ARGUMENT, "num_tokens must be >= 0, got %d", numTokens);
    if (numTokens == 0)
        return Status::kSUCCESS;
    DEAMOE_RETURN_IF_FAILED(detail::checkPointer(logits, "logits", false));
    if (params.hasRouterBias)
        DEAMOE_RETURN_IF_FAILED(detail::checkPointer(routerBias, "router bias", false));
    DEAMOE_RETURN_IF_FAILED(detail::checkOutputs(out));
    return detail::opsFor(dtype)->routeLogits(params, logits, routerBias, numTokens, out, stream);
}

Status route(LayerParams const& params, DataType dtype, void const* hidden, void const* routerWeight,
    void const* routerBias, void const* routerLogitBias, int32_t numTokens, RoutingOutputs const& out, void* workspace,
    size_t workspaceBytes, cudaStream_t stream) noexcept
{
    DEAMOE_RETURN_IF_FAILED(validate(params));
    DEAMOE_RETURN_IF_FAILED(detail::checkDtype(static_cast<int32_t>(dtype)));
    if (numTokens < 0)
        return fail(Status::kINVALID_ARGUMENT, "num_tokens must be >= 0, got %d", numTokens);
    if (numTokens == 0)
        return Status::kSUCCESS;
    DEAMOE_RETURN_IF_FAILED(detail::checkVectorizable(params, dtype));
    DEAMOE_RETURN_IF_FAILED(detail::checkPointer(hidden, "hidden"));
    DEAMOE_RETURN_IF_FAILED(detail::checkPointer(routerWeight, "router weight"));
    if (params.hasRouterBias)
        DEAMOE_RETURN_IF_FAILED(detail::checkPointer(routerBias, "router bias", false));
    if (params.hasRouterLogitBias)
        DEAMOE_RETURN_IF_FAILED(detail::checkPointer(routerLogitBias, "router logit bias", false));
    DEAMOE_RETURN_IF_FAILED(detail::checkOutputs(out));
    size_t const needed = detail::workspaceLayout(params, numTokens).routeBytes;
    if (!workspace || workspaceBytes < needed)
        return fail(Status::kINVALID_ARGUMENT, "route() needs a workspace of %zu bytes, got %zu", needed,
            workspace ? workspaceBytes : size_t{0});
    return detail::opsFor(dtype)->route(
        params, hidden, routerWeight, routerBias, routerLogitBias, numTokens, out, workspace, stream);
}

Status checkSupported(LayerParams const& params, DataType dtype) noexcept
{
    DEAMOE_RETURN_IF_FAILED(validate(params));
    DEAMOE_RETURN_IF_FAILED(detail::checkDtype(static_cast<int32_t>(dtype)));
    DEAMOE_RETURN_IF_FAILED(detail::checkVectorizable(params, dtype));
    size_t const routing = detail::routedSmemBytes(params);
    if (routing > detail::kSmemBudget)
        return fail(Status::kUNSUPPORTED,
            "num_experts %d, top_k %d: the routing blocks need %zu bytes of shared memory, over their %zu-byte budget",
            params.numDepartments * params.expertsPerDepartment, params.topK, routing, detail::kSmemBudget);
    return Status::kSUCCESS;
}

char const* variantName(int32_t variant) noexcept
{
    static char const* const names[kNumVariants] = {"default", "staged-down", "deep-loads", "staged-deep",
        "bit-dequant", "staged-down+bit-dequant", "deep-loads+bit-dequant", "staged-deep+bit-dequant", "staged-gate-up",
        "staged-down+staged-gate-up", "deep-loads+staged-gate-up", "staged-deep+staged-gate-up",
        "bit-dequant+staged-gate-up", "staged-down+bit-dequant+staged-gate-up", "deep-loads+bit-dequant+staged-gate-up",
        "staged-deep+bit-dequant+staged-gate-up"};
    return variant >= 0 && variant < kNumVariants ? names[variant] : nullptr;
}

Status currentDeviceName(char* name, size_t capacity) noexcept
{
    if (name == nullptr || capacity == 0)
        return fail(Status::kINVALID_ARGUMENT, "no room for the device name");
    name[0] = '\0';
    int device = 0;
    cudaDeviceProp props{};
    cudaError_t error = cudaGetDevice(&device);
    if (error == cudaSuccess)
        error = cudaGetDeviceProperties(&props, device);
    if (error != cudaSuccess)
    {
        (void) cudaGetLastError();
        return fail(Status::kCUDA_ERROR, "no CUDA device: %s", cudaGetErrorName(error));
    }
    std::snprintf(name, capacity, "%s", props.name);
    return Status::kSUCCESS;
}

Status forward(LayerParams const& params, LayerWeights const& weights, DataType dtype, void const* hidden, void* output,
    int32_t numTokens, void* workspace, size_t workspaceBytes, cudaStream_t stream) noexcept
{
    return forwardVariant(params, weights, dtype, 0, hidden, output, numTokens, workspace, workspaceBytes, stream);
}

Status forwardVariant(LayerParams const& params, LayerWeights const& weights, DataType dtype, int32_t variant,
    void const* hidden, void* output, int32_t numTokens, void* workspace, size_t workspaceBytes,
    cudaStream_t stream) noexcept
{
    DEAMOE_RETURN_IF_FAILED(checkSupported(params, dtype));
    if (variantName(variant) == nullptr)
        return fail(Status::kINVALID_ARGUMENT, "kernel variant must be 0..%d, got %d", kNumVariants - 1, variant);
    if (numTokens < 0)
        return fail(Status::kINVALID_ARGUMENT, "num_tokens must be >= 0, got %d", numTokens);
    if (numTokens == 0)
        return Status::kSUCCESS;
    DEAMOE_RETURN_IF_FAILED(detail::checkPointer(hidden, "hidden"));
    DEAMOE_RETURN_IF_FAILED(detail::checkPointer(output, "output", false));
    DEAMOE_RETURN_IF_FAILED(detail::checkPointer(weights.routerWeight, "router.weight"));
    if (params.hasRouterBias)
        DEAMOE_RETURN_IF_FAILED(detail::checkPointer(weights.routerBias, "router.bias", false));
    if (params.sharedWidth)
    {
        DEAMOE_RETURN_IF_FAILED(detail::checkPointer(weights.departmentGateUp, "departments.gate_up"));
        DEAMOE_RETURN_IF_FAILED(detail::checkPointer(weights.departmentDown, "departments.down"));
    }
    if (params.privateWidth)
    {
        DEAMOE_RETURN_IF_FAILED(detail::checkPointer(weights.expertGateUp, "experts.gate_up"));
        DEAMOE_RETURN_IF_FAILED(detail::checkPointer(weights.expertDown, "experts.down"));
    }
    if (params.sharedExpertWidth)
    {
        DEAMOE_RETURN_IF_FAILED(detail::checkPointer(weights.sharedGateUp, "shared_experts.gate_up"));
        DEAMOE_RETURN_IF_FAILED(detail::checkPointer(weights.sharedDown, "shared_experts.down"));
    }
    if (params.sharedExpertGate)
        DEAMOE_RETURN_IF_FAILED(detail::checkPointer(weights.sharedGate, "shared_experts.gate"));
    if (params.hasRouterLogitBias)
        DEAMOE_RETURN_IF_FAILED(detail::checkPointer(weights.routerLogitBias, "router.logit_bias", false));
    if (params.ffnBias)
    {
        // Biases are read element by element: no alignment needed.
        if (params.sharedWidth)
            DEAMOE_RETURN_IF_FAILED(
                detail::checkPointer(weights.departmentGateUpBias, "departments.gate_up_bias", false));
        DEAMOE_RETURN_IF_FAILED(detail::checkPointer(weights.expertGateUpBias, "experts.gate_up_bias", false));
        DEAMOE_RETURN_IF_FAILED(detail::checkPointer(weights.expertDownBias, "experts.down_bias", false));
        if (params.sharedExpertWidth)
        {
            DEAMOE_RETURN_IF_FAILED(
                detail::checkPointer(weights.sharedGateUpBias, "shared_experts.gate_up_bias", false));
            DEAMOE_RETURN_IF_FAILED(detail::checkPointer(weights.sharedDownBias, "shared_experts.down_bias", false));
        }
    }
    if (params.weightBits > 0)
    {
        if (params.sharedWidth)
        {
            DEAMOE_RETURN_IF_FAILED(detail::checkPointer(weights.departmentGateUpScales, "departments.gate_up.scales"));
            DEAMOE_RETURN_IF_FAILED(detail::checkPointer(weights.departmentDownScales, "departments.down.scales"));
        }
        if (params.privateWidth)
        {
            DEAMOE_RETURN_IF_FAILED(detail::checkPointer(weights.expertGateUpScales, "experts.gate_up.scales"));
            DEAMOE_RETURN_IF_FAILED(detail::checkPointer(weights.expertDownScales, "experts.down.scales"));
        }
        if (params.sharedExpertWidth)
        {
            DEAMOE_RETURN_IF_FAILED(detail::checkPointer(weights.sharedGateUpScales, "shared_experts.gate_up.scales"));
            DEAMOE_RETURN_IF_FAILED(detail::checkPointer(weights.sharedDownScales, "shared_experts.down.scales"));
        }
    }
    size_t const needed = detail::workspaceLayout(params, numTokens).forwardBytes;
    if (!workspace || workspaceBytes < needed)
        return fail(Status::kINVALID_ARGUMENT,
            "forward() for %d tokens needs a workspace of %zu bytes (workspaceSize), got %zu", numTokens, needed,
            workspace ? workspaceBytes : size_t{0});
    if (!detail::aligned16(workspace))
        return fail(Status::kUNSUPPORTED, "workspace must be 16-byte aligned");
    return detail::opsFor(dtype)->forward(params, weights, hidden, output, numTokens, workspace, variant, stream);
}

} // namespace deamoe

// ---------------------------------------------------------------------------------------
// C ABI

namespace
{

deamoe::LayerParams const* orInvalid(deamoe::LayerParams const* params)
{
    if (!params)
        deamoe::detail::fail(deamoe::Status::kINVALID_ARGUMENT, "params is null");
    return params;
}

int32_t code(deamoe::Status status)
{
    return static_cast<int32_t>(status);
}

} // namespace

extern "C"
{

int32_t deamoe_validate(deamoe::LayerParams const* params)
{
    if (!orInvalid(params))
        return code(deamoe::Status::kINVALID_ARGUMENT);
    return code(deamoe::validate(*params));
}

size_t deamoe_workspace_size(deamoe::LayerParams const* params, int32_t max_tokens, int32_t dtype)
{
    if (!params || dtype < 0 || dtype > 2)
        return 0;
    return deamoe::workspaceSize(*params, max_tokens, static_cast<deamoe::DataType>(dtype));
}

int32_t deamoe_route(deamoe::LayerParams const* params, int32_t dtype, void const* hidden, void const* router_weight,
    void const* router_bias, void const* router_logit_bias, int32_t num_tokens, int32_t* expert_ids, float* weights,
    int32_t* department_ids, int32_t* kept_departments, void* workspace, size_t workspace_bytes, cudaStream_t stream)
{
    if (!orInvalid(params))
        return code(deamoe::Status::kINVALID_ARGUMENT);
    deamoe::RoutingOutputs const out{expert_ids, weights, department_ids, kept_departments};
    return code(deamoe::route(*params, static_cast<deamoe::DataType>(dtype), hidden, router_weight, router_bias,
        router_logit_bias, num_tokens, out, workspace, workspace_bytes, stream));
}

int32_t deamoe_forward(deamoe::LayerParams const* params, deamoe::LayerWeights const* weights, int32_t dtype,
    void const* hidden, void* output, int32_t num_tokens, void* workspace, size_t workspace_bytes, cudaStream_t stream)
{
    if (!orInvalid(params))
        return code(deamoe::Status::kINVALID_ARGUMENT);
    if (!weights)
        return code(deamoe::detail::fail(deamoe::Status::kINVALID_ARGUMENT, "weights is null"));
    return code(deamoe::forward(*params, *weights, static_cast<deamoe::DataType>(dtype), hidden, output, num_tokens,
        workspace, workspace_bytes, stream));
}

int32_t deamoe_forward_variant(deamoe::LayerParams const* params, deamoe::LayerWeights const* weights, int32_t dtype,
    int32_t variant, void const* hidden, void* output, int32_t num_tokens, void* workspace, size_t workspace_bytes,
    cudaStream_t stream)
{
    if (!orInvalid(params))
        return code(deamoe::Status::kINVALID_ARGUMENT);
    if (!weights)
        return code(deamoe::detail::fail(deamoe::Status::kINVALID_ARGUMENT, "weights is null"));
    return code(deamoe::forwardVariant(*params, *weights, static_cast<deamoe::DataType>(dtype), variant, hidden, output,
        num_tokens, workspace, workspace_bytes, stream));
}

int32_t deamoe_num_variants(void)
{
    return deamoe::kNumVariants;
}

char const* deamoe_variant_name(int32_t variant)
{
    return deamoe::variantName(variant);
}

char const* deamoe_status_string(int32_t status)
{
    return deamoe::statusString(static_cast<deamoe::Status>(status));
}

void deamoe_set_programmatic_launch(int32_t enabled)
{
    deamoe::setProgrammaticLaunch(enabled != 0);
}

int32_t deamoe_programmatic_launch(void)
{
    return deamoe::programmaticLaunch() ? 1 : 0;
}

int32_t deamoe_max_tile_tokens(void)
{
    return deamoe::kMaxTileTokens;
}

char const* deamoe_last_error(void)
{
    return deamoe::lastErrorMessage();
}

int32_t deamoe_check_supported(deamoe::LayerParams const* params, int32_t dtype)
{
    if (!orInvalid(params))
        return code(deamoe::Status::kINVALID_ARGUMENT);
    return code(deamoe::checkSupported(*params, static_cast<deamoe::DataType>(dtype)));
}

int32_t deamoe_router_logits(deamoe::LayerParams const* params, int32_t dtype, void const* hidden,
    void const* router_weight, void const* router_logit_bias, int32_t num_tokens, float* logits, cudaStream_t stream)
{
    if (!orInvalid(params))
        return code(deamoe::Status::kINVALID_ARGUMENT);
    return code(deamoe::routerLogits(*params, static_cast<deamoe::DataType>(dtype), hidden, router_weight,
        router_logit_bias, num_tokens, logits, stream));
}

int32_t deamoe_route_logits(deamoe::LayerParams const* params, int32_t dtype, float const* logits,
    void const* router_bias, int32_t num_tokens, int32_t* expert_ids, float* weights, int32_t* department_ids,
    int32_t* kept_departments, cudaStream_t stream)
{
    if (!orInvalid(params))
        return code(deamoe::Status::kINVALID_ARGUMENT);
    deamoe::RoutingOutputs const out{expert_ids, weights, department_ids, kept_departments};
    return code(deamoe::routeLogits(
        *params, static_cast<deamoe::DataType>(dtype), logits, router_bias, num_tokens, out, stream));
}

} // extern "C"
