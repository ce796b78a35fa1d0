/*
 * The kernel of deamoe::route() (deamoeForward.cuh): one warp per token.
 */
#pragma once

#include "deamoeRoutedKernel.cuh" // DeviceBias

namespace deamoe
{
namespace detail
{

// ---------------------------------------------------------------------------------------
// route(): one warp per token, outputs straight to the caller's arrays.

template <class T>
struct RouteArgs
{
    RoutingConfig routing;
    float const* logits; // [numTokens][logitsStride]
    int32_t logitsStride;
    float const* routerBias; // [N] float32 or nullptr
    int32_t numTokens;
    RoutingOutputs out; // rows already offset to this launch's first token
};

template <class T>
__global__ void __launch_bounds__(kRouteThreads) routeKernel(RouteArgs<T> const args)
{
    beginDependentKernel();
    int const warp = static_cast<int>(threadIdx.x) / kWarpSize;
    int const t = static_cast<int>(blockIdx.x) * (kRouteThreads / kWarpSize) + warp;
    if (t >= args.numTokens)
        return;
    RoutingConfig const& cfg = args.routing;
    float* scratch = dynamicSmem() + warp * routingScratchFloats(cfg);
    routeToken(WarpLanes{}, cfg, args.logits + static_cast<size_t>(t) * args.logitsStride,
        DeviceBias<float>{args.routerBias}, scratch, args.out.expertIds + t * cfg.topK, args.out.weights + t * cfg.topK,
        args.out.departmentIds + t * cfg.topK, args.out.keptDepartments + t * cfg.topDepartments);
}

} // namespace detail
} // namespace deamoe
