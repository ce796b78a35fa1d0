/*
 * Internal to the kernel library: workspace layout, launch geometry and the per-dtype
 * entry points (defined in deamoeForward{Float,Half,Bf16}.cu, which instantiate
 * deamoeForward.cuh once per dtype so the three compile in parallel).
 */
#pragma once

#include <cstddef>
#include <cstdint>

#include "deamoeKernels.h"
#include "deamoePlan.cuh"
#include "deamoeRouting.cuh"

namespace deamoe
{
namespace detail
{

// Launch geometry. Changing these changes performance only, never results.
constexpr int kGemvThreads = 128; // every forward block: 4 warps
constexpr int kGemvWarps = kGemvThreads / kWarpSize;
constexpr int kDownRowsPerWarp = 2;
constexpr int kDownRowsPerTile = kGemvWarps * kDownRowsPerWarp; // 8 output rows per down block
constexpr int kTokensPerRoutingBlock = kGemvWarps;              // one warp per token
constexpr int kDownPartsPerGroup = 32;                          // parts whose metadata a down block stages at once
constexpr int kRouteThreads = 128;                              // route(): one warp per token
constexpr size_t kSmemBudget = 48 * 1024;                       // no opt-in attribute needed anywhere
constexpr size_t kAlign = 256;

// Kernel variants (variantName(), KERNELS.md "Variants"): a variant id is a set of these bits,
// each changing some kernels, so the ids combine them (3: staged-deep, 5: staged-down+bit-dequant).
constexpr int32_t kVariantStagedDown = 1;   // K3 with each part's h staged in shared memory
constexpr int32_t kVariantDeepLoads = 2;    // K2's float gate/up rows with twice the loads in flight
constexpr int32_t kVariantBitDequant = 4;   // quantized rows' codes to floats by bit tricks (K1, K2, K3)
constexpr int32_t kVariantStagedGateUp = 8; // K1/K2 gate/up: x staged in shared memory, whole rows per warp
inline bool stagesDown(int32_t variant)
{
    return (variant & kVariantStagedDown) != 0;
}
inline bool deepLoads(int32_t variant)
{
    return (variant & kVariantDeepLoads) != 0;
}
inline bool bitDequant(int32_t variant)
{
    return (variant & kVariantBitDequant) != 0;
}
inline bool stagesGateUp(int32_t variant)
{
    return (variant & kVariantStagedGateUp) != 0;
}
// Shared memory the staged-gate-up variant's blocks aim to stage x in at once (a window of
// columns of the tile's tokens, stagedGateUpColumns): a whole 7168-wide bf16 row at 1 token,
// while the blocks of K1 and K2 at 1-4 tokens still fit 7 or more per SM of an H100/H200.
constexpr size_t kStagedGateUpBudget = 16 * 1024;

// The step's synchronisation words (workspace `counters`), zeroed by K1 for K2.
enum Counter : int32_t
{
    kCounterTicket = 0,       // K2 blocks take their role in start order
    kCounterRoutedBlocks = 1, // K2 routing blocks done; the last builds the plan
    kCounterPlanReady = 2,    // 1 once the plan is written (release / acquire)
    kNumCounters = 3,
};

RoutingConfig routingConfig(LayerParams const& p);
PlanConfig planConfig(LayerParams const& p);

// Byte offsets into the workspace for a tile of up to `tileTokens` tokens.
struct WorkspaceLayout
{
    int32_t tileTokens;
    int32_t maxDepartmentParts;
    int32_t maxExpertParts;
    int32_t departmentSlotsPerToken; // min(g, k)
    int32_t logitsStride;            // N + 1 (column N: the shared-expert gate logit)
    int32_t downTiles;               // ceil(d / kDownRowsPerTile): K3's blocks
    size_t logits;                   // float [tile][N + 1]
    size_t counts;                   // int [2]
    size_t departments;              // int [maxDepartmentParts]
    size_t experts;                  // int [maxExpertParts]
    size_t departmentEntryCounts;    // int [maxDepartmentParts]
    size_t expertEntryCounts;        // int [maxExpertParts]
    size_t departmentEntries;        // PlanEntry [maxDepartmentParts][kMaxTileTokens]
    size_t expertEntries;            // PlanEntry [maxExpertParts][kMaxTileTokens]
    size_t departmentSlots;          // int [kMaxTileTokens]
    size_t counters;                 // int [kNumCounters]
    size_t expertIds;                // int [tile][k]: the tile's routing (K2's routing blocks)
    size_t routingWeights;           // float [tile][k]
    size_t departmentIds;            // int [tile][k]
    size_t keptDepartments;          // int [tile][g]
    size_t hShared;                  // float [tile][f_sh]
    size_t hDepartment;              // float [tile][min(g,k)][f_s]
    size_t hExpert;                  // float [tile][k][f_p]
    size_t sharedOut;                // float [tile][d]: the shared experts' output (K2 -> K3)
    size_t forwardBytes;             // everything above
    size_t routeBytes;               // logits only (route())
};

WorkspaceLayout workspaceLayout(LayerParams const& p, int32_t tileTokens);

// The quantization fields of p (weightBits, weightGroupSize, widths a whole number of
// groups); part of validate().
Status validateQuantization(LayerParams const& p) noexcept;

// Records the reason for a failure (deamoe_last_error()) and returns status.
Status fail(Status status, char const* format, ...) noexcept;

// The result of one launch (DEAMOE_LAUNCH's value): kCUDA_ERROR with the reason recorded
// if it failed. A failed launch's error is also cleared from the runtime's last-error
// state (cudaGetLastError), so that a non-sticky failure (too many resources, a bad
// configuration) fails this call only, not every later one; a sticky one (a broken
// context) keeps failing every launch anyway.
Status checkLaunch(char const* what, cudaError_t launched) noexcept;

// Dynamic shared memory of K2 (its routing blocks): the plan's scratch, then a routing
// scratch area per warp.
size_t routedSmemBytes(LayerParams const& p);

// Whether to launch the forward kernels as programmatic dependents: enabled
// (setProgrammaticLaunch; on unless DEAMOE_PROGRAMMATIC_LAUNCH=0 in the environment) and the
// current device is sm_90 or newer.
bool programmaticLaunchUsable() noexcept;

// What one dtype's translation unit provides. Pointers are already validated.
struct TypedOps
{
    Status (*forward)(LayerParams const& p, LayerWeights const& w, void const* hidden, void* output, int32_t numTokens,
        void* workspace, int32_t variant, cudaStream_t stream);
    Status (*route)(LayerParams const& p, void const* hidden, void const* routerWeight, void const* routerBias,
        void const* routerLogitBias, int32_t numTokens, RoutingOutputs const& out, void* workspace,
        cudaStream_t stream);
    Status (*routerLogits)(LayerParams const& p, void const* hidden, void const* routerWeight,
        void const* routerLogitBias, int32_t numTokens, float* logits, cudaStream_t stream);
    Status (*routeLogits)(LayerParams const& p, float const* logits, void const* routerBias, int32_t numTokens,
        RoutingOutputs const& out, cudaStream_t stream);
};

TypedOps const& typedOpsFloat();
TypedOps const& typedOpsHalf();
TypedOps const& typedOpsBf16();

} // namespace detail
} // namespace deamoe
