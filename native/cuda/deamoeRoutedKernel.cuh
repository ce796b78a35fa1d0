/*
 * K2 of the DeaMoE forward (deamoeForward.cuh): routing + plan, the shared experts' down,
 * the routed gate/up.
 */
#pragma once

#include "deamoeGemv.cuh"

namespace deamoe
{
namespace detail
{

// ---------------------------------------------------------------------------------------
// K2: routing + plan, shared experts' down, routed gate/up

template <class T>
struct DeviceBias
{
    T const* values; // nullptr: no bias
    DEAMOE_HD float operator()(int i) const
    {
#if defined(__CUDA_ARCH__) || defined(DEAMOE_SIMT_EMULATION)
        return values ? toFloat(values[i]) : 0.0f;
#else
        (void) i;
        return 0.0f; // the host pass of nvcc: never called
#endif
    }
};

template <class T>
struct RoutedArgs
{
    int32_t* counters; // [kNumCounters], zeroed by K1
    // Routing blocks (tickets 0 .. routingBlocks-1)
    int32_t routingBlocks;
    RoutingConfig routing;
    PlanConfig planConfig;
    float const* logits; // [tile][logitsStride]
    int32_t logitsStride;
    float const* routerBias; // [N] float32 or nullptr
    int32_t numTokens;
    int32_t* expertIds;       // [tile][k]: the tile's routing, read back by the plan builder
    float* weights;           // [tile][k]
    int32_t* departmentIds;   // [tile][k]
    int32_t* keptDepartments; // [tile][g]
    // Shared experts' down blocks (the next sharedDownBlocks tickets)
    int32_t sharedDownBlocks;
    T const* sharedDown;            // [d][f_sh] or nullptr
    uint8_t const* sharedDownCodes; // quantized (BITS > 0): [d][f_sh * BITS / 8] instead
    T const* sharedDownScales;      // [d][f_sh / G]
    T const* sharedDownBias;        // [d] or nullptr: added before the shared-expert gate
    int32_t hidden;
    int32_t sharedWidth;
    float const* hShared; // [tile][f_sh]
    int32_t sharedGate;   // 1: scale by sigmoid(logit column N)
    float* sharedOut;     // [tile][d]
    // Routed gate/up blocks (the remaining tickets), once the plan is ready
    GateUpArgs<T> gateUp;
};

// Routes tokens block*4 .. block*4+3 (a warp each); the last routing block to finish
// builds the plan and releases it. Dynamic shared memory: planScratchWords, then one
// routing scratch area per warp.
template <class T>
DEAMOE_DEVICE void routingBlock(RoutedArgs<T> const& args, int block)
{
    __shared__ int isLast;
    RoutingConfig const& cfg = args.routing;
    int const k = cfg.topK;
    int const g = cfg.topDepartments;
    int const warp = static_cast<int>(threadIdx.x) / kWarpSize;
    uint32_t* planScratch = reinterpret_cast<uint32_t*>(dynamicSmem());
    float* scratch
        = reinterpret_cast<float*>(planScratch + planScratchWords(args.planConfig)) + warp * routingScratchFloats(cfg);
    int const t = block * kTokensPerRoutingBlock + warp;
    if (t < args.numTokens)
    {
        routeToken(WarpLanes{}, cfg, args.logits + t * args.logitsStride, DeviceBias<float>{args.routerBias}, scratch,
            args.expertIds + t * k, args.weights + t * k, args.departmentIds + t * k, args.keptDepartments + t * g);
    }
    // Threadfence reduction: publish this block's routing, then count it in. Thread 0's
    // fences are cumulative: the first orders the whole block's writes (seen through the
    // barrier) before the count (release), the second the other blocks' routing before
    // this block's reads of it (acquire).
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
    {
        __threadfence();
        isLast = atomicAdd(args.counters + kCounterRoutedBlocks, 1) == args.routingBlocks - 1;
        __threadfence();
    }
    __syncthreads();
    if (!isLast)
        return;
    buildPlan(BlockLanes{}, WarpLanes{}, warp == 0, args.planConfig, args.numTokens, args.expertIds, args.weights,
        args.keptDepartments, planScratch, args.gateUp.plan);
    // Release the plan: every writer's writes, then (through the barrier) thread 0's
    // cumulative fence, then the flag the waiting blocks acquire.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
    {
        __threadfence();
        atomicExch(args.counters + kCounterPlanReady, 1);
    }
}

// The shared experts' down rows of this block (kDownRowsPerTile rows, all tokens) into
// sharedOut, scaled by the shared-expert gate.
template <class T, int TT, int BITS, bool BIT_DEQUANT>
DEAMOE_DEVICE void sharedDownBlock(RoutedArgs<T> const& args, int block)
{
    constexpr int E = Elems16<T>::value;
    int const warp = static_cast<int>(threadIdx.x) / kWarpSize;
    int const firstRow = block * kDownRowsPerTile + warp * kDownRowsPerWarp;
    if (firstRow >= args.hidden)
        return;
    int offset[TT];
#pragma unroll
    for (int t = 0; t < TT; ++t)
        offset[t] = t * args.sharedWidth;
    float acc[kDownRowsPerWarp][TT] = {};
    if constexpr (BITS > 0)
    {
        QuantRow<T> rows[kDownRowsPerWarp];
        downQuantRows<BITS>(args.sharedDownCodes, args.sharedDownScales, args.sharedWidth, args.hidden,
            args.gateUp.groupShift, firstRow, rows);
        accumulateQuantRows<BITS, kQuantUnroll, T, float, kDownRowsPerWarp, TT, false, BIT_DEQUANT>(rows,
            args.gateUp.groupShift, 0, args.sharedWidth * BITS / 128, args.hShared, offset, firstTokens(args.numTokens),
            acc);
    }
    else
    {
        T const* rows[kDownRowsPerWarp];
        downRowPointers(args.sharedDown, args.sharedWidth, args.hidden, firstRow, rows);
        accumulateRows<T, float, kDownRowsPerWarp, TT>(
            rows, 0, args.sharedWidth / E, args.hShared, offset, firstTokens(args.numTokens), acc);
    }
    storeRows<TT>(acc, firstRow, args.hidden, args.numTokens, [&args](int t, int row, float value) {
        value += biasAt(args.sharedDownBias, row);
        if (args.sharedGate)
            value *= sigmoid(args.logits[t * args.logitsStride + args.routing.numExperts]);
        args.sharedOut[static_cast<size_t>(t) * args.hidden + row] = value;
    });
}

// Blocks per SM K2 asks ptxas to fit: quantized weights at 1 token, kQuantOneTokenMinBlocks,
// as K1's gate/up (GateUpMinBlocks); otherwise 1, i.e. the registers it needs (its
// shared-down and routing roles spill at 128 for 16 tokens); kStagedQuantOneTokenMinBlocks
// for the staged-gate-up variant (STAGED).
template <int TT, int BITS, bool STAGED = false>
struct RoutedMinBlocks
{
    static constexpr int value
        = BITS > 0 && TT == 1 ? (STAGED ? kStagedQuantOneTokenMinBlocks : kQuantOneTokenMinBlocks) : 1;
};

// GATE_UP_UNROLL: chunks per float row in flight in the gate/up blocks (the deep-loads
// variant: twice Unroll's, for 1-4 tokens on float weights). BIT_DEQUANT: the bit-dequant
// variant's code conversion (quantized weights). STAGED: the staged-gate-up variant's gate/up
// blocks (gateUpBlock); their staged x takes the dynamic shared memory the routing blocks use.
template <class T, int TT, int BITS, int GATE_UP_UNROLL = Unroll<TT>::value, bool BIT_DEQUANT = false,
    bool STAGED = false>
__global__ void __launch_bounds__(kGemvThreads, RoutedMinBlocks<TT, BITS, STAGED>::value)
    routedKernel(RoutedArgs<T> const args)
{
    beginDependentKernel();
    // Roles by ticket, in the order blocks start (not blockIdx): the routing blocks are
    // certainly running before any block waits for their plan, whatever the scheduler
    // does, and the shared-down blocks start before the waiting ones take SM slots.
    __shared__ int ticket;
    if (threadIdx.x == 0)
        ticket = atomicAdd(args.counters + kCounterTicket, 1);
    __syncthreads();
    int block = ticket;
    if (block < args.routingBlocks)
    {
        routingBlock(args, block);
        return;
    }
    block -= args.routingBlocks;
    if (block < args.sharedDownBlocks)
    {
        sharedDownBlock<T, TT, BITS, BIT_DEQUANT>(args, block);
        return;
    }
    block -= args.sharedDownBlocks;
    if (threadIdx.x == 0)
    {
        while (loadAcquire(args.counters + kCounterPlanReady) == 0)
            __nanosleep(256);
    }
    __syncthreads(); // the plan is visible to the whole block from here
    gateUpBlock<T, TT, BITS, GATE_UP_UNROLL, BIT_DEQUANT, STAGED>(args.gateUp, block);
}

} // namespace detail
} // namespace deamoe
