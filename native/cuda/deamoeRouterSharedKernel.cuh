/*
 * K1 of the DeaMoE forward (deamoeForward.cuh): router logits and the shared experts' gate/up.
 */
#pragma once

#include "deamoeGemv.cuh"

namespace deamoe
{
namespace detail
{

// ---------------------------------------------------------------------------------------
// K1: router logits and the shared experts' gate/up

// Blocks per SM K1 asks ptxas to fit: for 16 tokens, 4 (<= 128 registers) instead of the
// 3 that ~150 registers allow, a third more loads in flight per SM; below that the
// registers allow more blocks than are needed. (K2 spills at 128: its shared-down and
// routing roles need more.) int4 at 16 tokens: 3, it spills at 128 on sm_86/87/89 (and
// int8 spills on sm_110 at 3, not at 4: ptxas). float32 activations at 16 tokens: 3 too,
// as the gate/up biases and the clamped activation of the epilogue spill them at 128 on
// sm_86/87/89 (float32 is the reference dtype, not the one a device decodes in). Quantized
// weights at 1 token: kQuantOneTokenMinBlocks, measured faster on an H200
// (kStagedQuantOneTokenMinBlocks for the staged-gate-up variant, STAGED).
template <class T, int TT, int BITS, bool STAGED = false>
struct GateUpMinBlocks
{
    static constexpr bool kWide = BITS == 4 || (BITS == 0 && sizeof(T) == 4);
    static constexpr int kQuantOneToken = STAGED ? kStagedQuantOneTokenMinBlocks : kQuantOneTokenMinBlocks;
    static constexpr int value = TT >= 16 ? (kWide ? 3 : 4) : (BITS > 0 && TT == 1 ? kQuantOneToken : 1);
};

// STAGED: the staged-gate-up variant (gateUpBlock).
template <class T, int TT, int BITS, bool BIT_DEQUANT = false, bool STAGED = false>
__global__ void __launch_bounds__(kGemvThreads, GateUpMinBlocks<T, TT, BITS, STAGED>::value)
    routerSharedKernel(GateUpArgs<T> const args)
{
    beginDependentKernel();
    // K2 takes tickets and counts routing blocks on these: zero them for it. The
    // workspace's content on entry is arbitrary, and K2 starts after K1 has completed.
    if (args.counters && blockIdx.x == 0 && threadIdx.x < kNumCounters)
        args.counters[threadIdx.x] = 0;
    gateUpBlock<T, TT, BITS, Unroll<TT>::value, BIT_DEQUANT, STAGED>(args, static_cast<int>(blockIdx.x));
}

} // namespace detail
} // namespace deamoe
