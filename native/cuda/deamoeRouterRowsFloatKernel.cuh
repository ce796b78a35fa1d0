/*
 * Router logits from a float32 router weight in a half-precision layer (deamoeForward.cuh).
 */
#pragma once

#include "deamoeGemv.cuh"

namespace deamoe
{
namespace detail
{

// ---------------------------------------------------------------------------------------
// Router logits from a float32 router weight in a half-precision layer (spec, "Router
// precision"): one warp per router row, each lane a strided share of d, then a warp sum.
// The fused K1 reads rows in the activation dtype's 16-byte chunks; this keeps it that way
// and handles the small float32 router (N*d*4 bytes) on its own.

template <class T>
struct RouterRowsArgs
{
    T const* x;                // [tile][d]
    float const* routerWeight; // [N][d] float32
    int32_t hidden;
    int32_t numExperts;
    int32_t numTokens;
    float* logits; // [tile][logitsStride]
    int32_t logitsStride;
    int32_t* counters;      // [kNumCounters] zeroed for K2, or nullptr (route())
    float const* logitBias; // [N] or nullptr: z = x Wr^T + b_z
};

template <class T, int TT>
__global__ void __launch_bounds__(kGemvThreads) routerRowsFloatKernel(RouterRowsArgs<T> const args)
{
    beginDependentKernel();
    if (args.counters && blockIdx.x == 0 && threadIdx.x < kNumCounters)
        args.counters[threadIdx.x] = 0;
    int const lane = static_cast<int>(threadIdx.x) & (kWarpSize - 1);
    int const row = static_cast<int>(blockIdx.x) * kGemvWarps + static_cast<int>(threadIdx.x) / kWarpSize;
    if (row >= args.numExperts)
        return;
    float const* w = args.routerWeight + static_cast<size_t>(row) * args.hidden;
    float const bias = args.logitBias ? args.logitBias[row] : 0.0f;
    float acc[TT];
#pragma unroll
    for (int t = 0; t < TT; ++t)
        acc[t] = 0.0f;
    for (int i = lane; i < args.hidden; i += kWarpSize)
    {
        float const wi = w[i];
#pragma unroll
        for (int t = 0; t < TT; ++t)
        {
            if (t < args.numTokens)
                acc[t] = fmaf(wi, toFloat(args.x[static_cast<size_t>(t) * args.hidden + i]), acc[t]);
        }
    }
#pragma unroll
    for (int t = 0; t < TT; ++t)
    {
        float const sum = warpSum(acc[t]) + bias;
        if (lane == 0 && t < args.numTokens)
            args.logits[static_cast<size_t>(t) * args.logitsStride + row] = sum;
    }
}

} // namespace detail
} // namespace deamoe
