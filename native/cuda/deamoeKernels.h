/*
 * DeaMoE CUDA kernels: the public surface shared by the TensorRT plugin and the Python
 * binding (deamoe_trt.cuda). The math is docs/spec.md; the routing
 * reference is deamoe_trt/routing.py.
 *
 * Contract: additions are fine, changes to existing signatures must update both callers
 * (plugins/deamoe/deamoePlugin.cpp and deamoe_trt/cuda/).
 */
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace deamoe
{

enum class DataType : int32_t
{
    kFLOAT = 0,
    kHALF = 1,
    kBF16 = 2,
};

enum class ScoreFunc : int32_t
{
    kSOFTMAX = 0,
    kSIGMOID = 1,
};

enum class DepartmentScore : int32_t
{
    kMAX = 0,
    kSUM_TOP2 = 1,
    kSUM = 2,
};

// The FFN activation of every part (spec, "Clamped SwiGLU"; deamoe_trt/activation.py).
enum class Activation : int32_t
{
    kSWIGLU = 0,         // silu(g) * u
    kSWIGLU_CLAMPED = 1, // g' = min(g, limit), u' = clamp(u, +-limit): (u' + 1) * g' * sigmoid(alpha g')
};

// Sizes and routing of one layer; field for field the Python DeaMoEConfig.
struct LayerParams
{
    int32_t hidden;               // d
    int32_t numDepartments;       // D
    int32_t expertsPerDepartment; // m
    int32_t sharedWidth;          // f_s (0: no department shared part)
    int32_t privateWidth;         // f_p (0: no private part)
    int32_t topK;                 // k
    int32_t topDepartments;       // g
    ScoreFunc scoreFunc;
    DepartmentScore departmentScore;
    int32_t normTopkProb; // bool
    float routedScalingFactor;
    int32_t hasRouterBias;     // bool
    int32_t sharedExpertWidth; // f_sh (0: none)
    int32_t sharedExpertGate;  // bool
    int32_t ffnBias;           // bool: gate/up biases on every part, down biases on experts and shared experts
    Activation activation;
    float swigluAlpha;           // kSWIGLU_CLAMPED's alpha
    float swigluLimit;           // kSWIGLU_CLAMPED's limit
    int32_t hasRouterLogitBias;  // bool: z = x Wr^T + b_z
    int32_t weightBits;          // 0: float FFN weights; 4 or 8: packed codes (docs/quantization.md)
    int32_t weightGroupSize;     // input columns per scale (0 when weightBits is 0)
    int32_t routerWeightFloat32; // bool: router.weight is float32 (else the activation dtype)
};

// Device pointers in the canonical layouts of the spec ([out, in], gate rows then up
// rows). All share the activation dtype, except the router's (spec, "Router precision"):
// routerBias and routerLogitBias are float32, routerWeight float32 when
// params.routerWeightFloat32. Absent parts are nullptr.
struct LayerWeights
{
    void const* routerWeight;     // [N, d]
    void const* routerBias;       // [N] float32 or nullptr
    void const* departmentGateUp; // [D, 2*f_s, d] or nullptr
    void const* departmentDown;   // [D, d, f_s] or nullptr
    void const* expertGateUp;     // [N, 2*f_p, d] or nullptr
    void const* expertDown;       // [N, d, f_p] or nullptr
    void const* sharedGateUp;     // [2*f_sh, d] or nullptr
    void const* sharedDown;       // [d, f_sh] or nullptr
    void const* sharedGate;       // [1, d] or nullptr
    // weightBits > 0: the six FFN weights above are packed codes [..., rows, cols * bits / 8]
    // bytes and these their scales [..., rows, cols / weightGroupSize] in the activation dtype.
    void const* departmentGateUpScales; // [D, 2*f_s, d/G] or nullptr
    void const* departmentDownScales;   // [D, d, f_s/G] or nullptr
    void const* expertGateUpScales;     // [N, 2*f_p, d/G] or nullptr
    void const* expertDownScales;       // [N, d, f_p/G] or nullptr
    void const* sharedGateUpScales;     // [2*f_sh, d/G] or nullptr
    void const* sharedDownScales;       // [d, f_sh/G] or nullptr
    // params.hasRouterLogitBias: the logit bias; params.ffnBias: the FFN biases of the parts
    // present (never quantized: the activation dtype). Departments have no down bias.
    void const* routerLogitBias;      // [N] float32 or nullptr
    void const* departmentGateUpBias; // [D, 2*f_s] or nullptr
    void const* expertGateUpBias;     // [N, 2*f_p] or nullptr
    void const* expertDownBias;       // [N, d] or nullptr
    void const* sharedGateUpBias;     // [2*f_sh] or nullptr
    void const* sharedDownBias;       // [d] or nullptr
};

// Routing results for T tokens, device memory, row-major.
struct RoutingOutputs
{
    int32_t* expertIds;       // [T, k], best selection score first, ties to the lower id
    float* weights;           // [T, k], w_e
    int32_t* departmentIds;   // [T, k], expertIds / m
    int32_t* keptDepartments; // [T, g], stage-1 departments, best first
};

enum class Status : int32_t
{
    kSUCCESS = 0,
    kINVALID_PARAMS = 1,   // a LayerParams that DeaMoEConfig would reject
    kINVALID_ARGUMENT = 2, // null pointer, tokens < 0, workspace too small
    kUNSUPPORTED = 3,      // dtype or size this build cannot run
    kCUDA_ERROR = 4,       // a launch failed; lastErrorMessage() names it and the CUDA error
};

char const* statusString(Status status) noexcept;

// Checks params the way DeaMoEConfig does; kSUCCESS when valid.
Status validate(LayerParams const& params) noexcept;

// Bytes of scratch memory forward() needs for up to maxTokens tokens.
size_t workspaceSize(LayerParams const& params, int32_t maxTokens, DataType dtype) noexcept;

// Routing only (spec steps 1-5), for tests and for callers that want the decisions.
// routerLogitBias: [N] float32 when params.hasRouterLogitBias (else ignored).
Status route(LayerParams const& params, DataType dtype, void const* hidden, void const* routerWeight,
    void const* routerBias, void const* routerLogitBias, int32_t numTokens, RoutingOutputs const& out, void* workspace,
    size_t workspaceBytes, cudaStream_t stream) noexcept;

// The whole layer: route, plan (distinct departments/experts with their tokens), grouped
// SwiGLU over the plan reading every weight row once, deterministic weighted sum.
// hidden and output are [numTokens, d] in dtype.
Status forward(LayerParams const& params, LayerWeights const& weights, DataType dtype, void const* hidden, void* output,
    int32_t numTokens, void* workspace, size_t workspaceBytes, cudaStream_t stream) noexcept;

// ---- Tiling, workspace, streams and quantized weights. ----
// native/cuda/KERNELS.md documents the design, workspace and stream behaviour.

// forward() processes the batch in tiles of this many tokens: within a tile every used
// weight row is read once; a batch of T tokens reads them ceil(T / kMaxTileTokens) times.
constexpr int32_t kMaxTileTokens = 16;

// Why the last call on this thread did not return kSUCCESS (one line, never null; empty
// after a success). For kCUDA_ERROR it names the failed launch and the CUDA error.
char const* lastErrorMessage() noexcept;

// Whether forward() can run a layer of params in dtype: the config (validate), the dtype,
// every row a whole number of 16-byte vectors, the routing block's shared memory. forward()
// checks the same before it launches anything; the TensorRT plugin calls this when it is
// configured (build and runtime), so a layer it cannot run fails there, the limit named.
Status checkSupported(LayerParams const& params, DataType dtype) noexcept;

// Router logits z = x Wr^T (+ b_z, routerLogitBias [N] float32 when
// params.hasRouterLogitBias) accumulated in float32: logits is [numTokens, N] float32
// (device memory). The exact logits route() and forward() route from. No workspace.
Status routerLogits(LayerParams const& params, DataType dtype, void const* hidden, void const* routerWeight,
    void const* routerLogitBias, int32_t numTokens, float* logits, cudaStream_t stream) noexcept;

// Spec steps 1-5 from given float32 logits [numTokens, N] (device memory); routerBias is
// [N] float32 or nullptr. route() == routerLogits() then routeLogits(). No workspace.
Status routeLogits(LayerParams const& params, DataType dtype, float const* logits, void const* routerBias,
    int32_t numTokens, RoutingOutputs const& out, cudaStream_t stream) noexcept;

// Programmatic dependent launch (Hopper and newer; ignored before sm_90): each forward
// kernel may be scheduled while the previous one drains, hiding launch gaps. Results are
// identical either way (every kernel waits for its predecessor before touching memory).
// On by default; DEAMOE_PROGRAMMATIC_LAUNCH=0 in the environment turns it off at load.
// Process-wide; safe inside CUDA graph capture (CUDA >= 12.3).
void setProgrammaticLaunch(bool enabled) noexcept;
bool programmaticLaunch() noexcept;

// Kernel variants: other kernels for the same forward, chosen per call (forwardVariant; the
// per-GPU table of deamoe_trt/cuda/tuned/ picks one per layer shape, dtype, bits and tokens).
// They compute the same math in the same per-lane order, except where KERNELS.md
// ("Variants") says what they round differently; 0 is forward()'s. A variant that does not
// apply to a launch (its shared memory would not fit, say) runs the default kernel there.
constexpr int32_t kNumVariants = 16;
// The variant's name ("default", "staged-down", "deep-loads", "staged-deep", then the same four
// with "bit-dequant": "bit-dequant", "staged-down+bit-dequant", ..., then those eight with
// "staged-gate-up": "staged-gate-up", "staged-down+staged-gate-up", ...), or nullptr for an id
// out of range.
char const* variantName(int32_t variant) noexcept;
// forward() with the kernels of `variant` (0 .. kNumVariants - 1; else kINVALID_ARGUMENT).
Status forwardVariant(LayerParams const& params, LayerWeights const& weights, DataType dtype, int32_t variant,
    void const* hidden, void* output, int32_t numTokens, void* workspace, size_t workspaceBytes,
    cudaStream_t stream) noexcept;

// The current CUDA device's name (cudaDeviceProp::name, as torch.cuda.get_device_name gives
// it: the per-GPU variant tables are named after it) into name[capacity], NUL-terminated;
// kCUDA_ERROR without a device.
Status currentDeviceName(char* name, size_t capacity) noexcept;

} // namespace deamoe

// C ABI for ctypes (deamoe_trt.cuda). Same semantics; returns a Status as int32_t.
extern "C"
{
int32_t deamoe_validate(deamoe::LayerParams const* params);
size_t deamoe_workspace_size(deamoe::LayerParams const* params, int32_t max_tokens, int32_t dtype);
int32_t deamoe_route(deamoe::LayerParams const* params, int32_t dtype, void const* hidden, void const* router_weight,
    void const* router_bias, void const* router_logit_bias, int32_t num_tokens, int32_t* expert_ids, float* weights,
    int32_t* department_ids, int32_t* kept_departments, void* workspace, size_t workspace_bytes, cudaStream_t stream);
int32_t deamoe_forward(deamoe::LayerParams const* params, deamoe::LayerWeights const* weights, int32_t dtype,
    void const* hidden, void* output, int32_t num_tokens, void* workspace, size_t workspace_bytes, cudaStream_t stream);
char const* deamoe_status_string(int32_t status);

// Additions (see above).
int32_t deamoe_max_tile_tokens(void);
char const* deamoe_last_error(void);
int32_t deamoe_check_supported(deamoe::LayerParams const* params, int32_t dtype);
int32_t deamoe_router_logits(deamoe::LayerParams const* params, int32_t dtype, void const* hidden,
    void const* router_weight, void const* router_logit_bias, int32_t num_tokens, float* logits, cudaStream_t stream);
int32_t deamoe_route_logits(deamoe::LayerParams const* params, int32_t dtype, float const* logits,
    void const* router_bias, int32_t num_tokens, int32_t* expert_ids, float* weights, int32_t* department_ids,
    int32_t* kept_departments, cudaStream_t stream);
void deamoe_set_programmatic_launch(int32_t enabled);
int32_t deamoe_programmatic_launch(void);
int32_t deamoe_num_variants(void);
char const* deamoe_variant_name(int32_t variant);
int32_t deamoe_forward_variant(deamoe::LayerParams const* params, deamoe::LayerWeights const* weights, int32_t dtype,
    int32_t variant, void const* hidden, void* output, int32_t num_tokens, void* workspace, size_t workspace_bytes,
    cudaStream_t stream);
}
