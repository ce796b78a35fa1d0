/*
 * DeaMoE forward kernels, templated on the dtype T (float, __half, __nv_bfloat16) and on
 * TT, the token capacity of a step tile rounded up to a power of two (1, 2, 4, 8, 16).
 *
 * One step tile (<= kMaxTileTokens tokens) is four launches on one stream:
 *   K1 gateUpKernel (mode 0)  router logits (+ shared-expert gate logit) and the
 *                             shared experts' gate/up -> h_sh = silu(g) * u
 *   K2 routePlanKernel        block 0: route every token (warp per token) and build the
 *                             plan; blocks 1..: shared experts' down -> partial slot
 *                             (block 0's latency hides behind that streaming)
 *   K3 gateUpKernel (mode 1)  gate/up of every used department and expert part, for the
 *                             tokens that use it -> h = w * silu(g) * u per (token, slot)
 *   K4 downKernel             down of every used part -> per-(token, slot) partials; the
 *                             last block to finish a row tile sums that tile's partials in
 *                             a fixed order and writes the output (no float atomics)
 * K3 and K4 are launched over the worst-case plan (min(D, T*min(g,k)) departments,
 * min(N, T*k) experts); blocks beyond the plan's actual counts exit at once, so the host
 * never waits on the plan and the whole forward is CUDA-graph capturable.
 *
 * Every weight row is streamed once per tile with 16-byte non-allocating loads; each
 * loaded 16-byte chunk is applied to all of the part's tokens (up to TT) from registers.
 * Gate/up rows are split over `slices` warps when d is long, so that one warp's share
 * stays small and many warps keep loads in flight (memory-bound GEMV).
 */
#pragma once

#include <algorithm>
#include <cstring>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "deamoeInternal.h"

#if defined(__CUDACC__)
// Kernel launch (see launchKernel below), an expression giving the launch's cudaError_t;
// the SIMT emulator (tests) defines its own.
#define DEAMOE_LAUNCH(kernel, grid, block, smem, stream, args)                                                         \
    ::deamoe::detail::launchKernel((kernel), (grid), (block), (smem), (stream), (args))
#elif !defined(DEAMOE_LAUNCH)
#error "deamoeForward.cuh needs nvcc (or the SIMT emulator's DEAMOE_LAUNCH)"
#endif

namespace deamoe
{
namespace detail
{

// ---------------------------------------------------------------------------------------
// dtype helpers

template <class T>
struct Elems16; // elements of T in 16 bytes
template <>
struct Elems16<float>
{
    static constexpr int value = 4;
};
template <>
struct Elems16<__half>
{
    static constexpr int value = 8;
};
template <>
struct Elems16<__nv_bfloat16>
{
    static constexpr int value = 8;
};

DEAMOE_DEVICE float toFloat(float v)
{
    return v;
}
DEAMOE_DEVICE float toFloat(__half v)
{
    return __half2float(v);
}
DEAMOE_DEVICE float toFloat(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}

template <class T>
DEAMOE_DEVICE T fromFloat(float v);
template <>
DEAMOE_DEVICE float fromFloat<float>(float v)
{
    return v;
}
template <>
DEAMOE_DEVICE __half fromFloat<__half>(float v)
{
    return __float2half_rn(v);
}
template <>
DEAMOE_DEVICE __nv_bfloat16 fromFloat<__nv_bfloat16>(float v)
{
    return __float2bfloat16_rn(v);
}

template <class T>
DEAMOE_DEVICE void unpack(uint4 v, float (&f)[Elems16<T>::value]);

template <>
DEAMOE_DEVICE void unpack<float>(uint4 v, float (&f)[4])
{
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
}

template <>
DEAMOE_DEVICE void unpack<__half>(uint4 v, float (&f)[8])
{
    uint32_t const words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)
    {
        __half2_raw raw;
        raw.x = static_cast<unsigned short>(words[i] & 0xffffu); // lower address: first element
        raw.y = static_cast<unsigned short>(words[i] >> 16);
        float2 const pair = __half22float2(__half2(raw));
        f[2 * i] = pair.x;
        f[2 * i + 1] = pair.y;
    }
}

template <>
DEAMOE_DEVICE void unpack<__nv_bfloat16>(uint4 v, float (&f)[8])
{
    // bf16 is the upper half of a float32: widening is a shift or a mask.
    uint32_t const words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)
    {
        f[2 * i] = __uint_as_float(words[i] << 16);
        f[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
}

// Weights are read exactly once per step: bypass L1 so that the small, reused operands
// (activations, intermediate h) stay cached there. Read-only for the kernel's lifetime.
DEAMOE_DEVICE uint4 loadStreaming(void const* address)
{
#if defined(__CUDA_ARCH__)
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(address));
    return v;
#else
    return *static_cast<uint4 const*>(address);
#endif
}

#if defined(__CUDACC__)
// The block's dynamic shared memory (16-byte aligned).
DEAMOE_DEVICE float* dynamicSmem()
{
    extern __shared__ float4 dynamicSmemRaw[];
    return reinterpret_cast<float*>(dynamicSmemRaw);
}
#endif

// E activation values starting at p (16-byte aligned), as float.
template <class A, int E>
DEAMOE_DEVICE void loadActivation(A const* p, float (&f)[E])
{
    if constexpr (sizeof(A) * E == 16)
    {
        unpack<A>(__ldg(reinterpret_cast<uint4 const*>(p)), f);
    }
    else
    {
        static_assert(sizeof(A) == 4, "activation chunks wider than 16 bytes are float32");
#pragma unroll
        for (int i = 0; i < E / 4; ++i)
        {
            float4 const v = __ldg(reinterpret_cast<float4 const*>(p) + i);
            f[4 * i] = v.x;
            f[4 * i + 1] = v.y;
            f[4 * i + 2] = v.z;
            f[4 * i + 3] = v.w;
        }
    }
}

// Programmatic dependent launch (sm_90+, opt-in: setProgrammaticLaunch). Every kernel
// first waits for the kernel before it in the stream to complete and flush
// (griddepcontrol.wait: a no-op when not launched as a dependent), then lets the next one
// be scheduled. No kernel body ever overlaps its predecessor; only launch latency and
// block scheduling do.
DEAMOE_DEVICE void beginDependentKernel()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

DEAMOE_DEVICE float warpSum(float v)
{
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

DEAMOE_DEVICE float silu(float v)
{
    return v / (1.0f + expf(-v));
}

DEAMOE_DEVICE float sigmoid(float v)
{
    return 1.0f / (1.0f + expf(-v));
}

// Chunks (16-byte units) each lane keeps in flight per row; fewer for wide tiles, whose
// per-token accumulators need the registers.
template <int TT>
struct Unroll
{
    static constexpr int value = TT <= 4 ? 4 : (TT <= 8 ? 2 : 1);
};

// acc[r][t] += this lane's share of dot(rows[r][chunk range], act[offset[t] + ...]) for
// t < numTokens. No cross-lane reduction. The order of operations per (r, t) depends only
// on the lane and the chunk range: results are bitwise reproducible.
template <class W, class A, int R, int TT>
DEAMOE_DEVICE void accumulateRows(W const* const (&rows)[R], int chunkBegin, int chunkEnd, A const* act,
    int const (&offset)[TT], int numTokens, float (&acc)[R][TT])
{
    constexpr int E = Elems16<W>::value;
    constexpr int U = Unroll<TT>::value;
    int const lane = static_cast<int>(threadIdx.x) & (kWarpSize - 1);
    for (int c0 = chunkBegin + lane; c0 < chunkEnd; c0 += kWarpSize * U)
    {
        uint4 raw[U][R];
#pragma unroll
        for (int u = 0; u < U; ++u)
        {
            int const c = c0 + u * kWarpSize;
#pragma unroll
            for (int r = 0; r < R; ++r)
                raw[u][r] = c < chunkEnd ? loadStreaming(rows[r] + static_cast<size_t>(c) * E) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
        {
            int const c = c0 + u * kWarpSize;
            if (c < chunkEnd)
            {
                float w[R][E];
#pragma unroll
                for (int r = 0; r < R; ++r)
                    unpack<W>(raw[u][r], w[r]);
#pragma unroll
                for (int t = 0; t < TT; ++t)
                {
                    if (t < numTokens)
                    {
                        float a[E];
                        loadActivation<A, E>(act + offset[t] + static_cast<size_t>(c) * E, a);
#pragma unroll
                        for (int r = 0; r < R; ++r)
                        {
#pragma unroll
                            for (int e = 0; e < E; ++e)
                                acc[r][t] = fmaf(w[r][e], a[e], acc[r][t]);
                        }
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// K1 / K3: gate/up GEMV (and the router logits, which are the same kind of x-only GEMV)

enum GateUpKind : int32_t
{
    kKindRouter = 0,
    kKindShared = 1,
    kKindDepartment = 2,
    kKindExpert = 3,
};

template <class T>
struct GateUpArgs
{
    T const* x;             // [tile][d]
    int32_t hidden;         // d
    int32_t numTokens;      // tokens of this tile
    int32_t slices;         // warps per neuron (split of d); kGemvWarps / slices neurons per block
    int32_t chunksPerSlice; // 16-byte chunks of one row per slice
    int32_t routedMode;     // 0: K1 (router + shared experts), 1: K3 (plan parts)
    // K1
    T const* routerWeight;  // [N][d]
    int32_t routerRows;     // N (+1 when sharedGateRow)
    int32_t numExperts;     // N
    T const* sharedGateRow; // [d] or nullptr: routed as logit column N
    float* logits;          // [tile][logitsStride]
    int32_t logitsStride;
    int32_t routerBlocks;
    T const* sharedGateUp; // [2 f_sh][d] or nullptr
    int32_t sharedWidth;   // f_sh
    float* hShared;        // [tile][f_sh]
    // K3
    PlanView plan;
    T const* departmentGateUp; // [D][2 f_s][d] or nullptr
    int32_t departmentWidth;   // f_s
    float* hDepartment;        // [tile][min(g,k)][f_s]
    int32_t departmentSlots;   // min(g, k)
    int32_t departmentBlocksPerPart;
    T const* expertGateUp; // [N][2 f_p][d] or nullptr
    int32_t expertWidth;   // f_p
    float* hExpert;        // [tile][k][f_p]
    int32_t topK;
    int32_t expertBlocksPerPart;
};

template <class T, int TT>
__global__ void __launch_bounds__(kGemvThreads) gateUpKernel(GateUpArgs<T> const args)
{
    beginDependentKernel();
    constexpr int E = Elems16<T>::value;
    __shared__ float partial[kGemvWarps][2][TT];

    int const warp = static_cast<int>(threadIdx.x) / kWarpSize;
    int const lane = static_cast<int>(threadIdx.x) & (kWarpSize - 1);
    int const d = args.hidden;
    int const neuronsPerBlock = kGemvWarps / args.slices;

    // Resolve this block's work item (block-uniform).
    int kind;
    int firstUnit; // first neuron (or router row pair) of the block
    int width;     // neurons (or router row pairs) in the part
    T const* base = nullptr;
    PlanEntry const* entries = nullptr;
    int numTokens = args.numTokens;
    int block = static_cast<int>(blockIdx.x);
    if (!args.routedMode)
    {
        if (block < args.routerBlocks)
        {
            kind = kKindRouter;
            firstUnit = block * neuronsPerBlock;
            width = (args.routerRows + 1) / 2;
        }
        else
        {
            kind = kKindShared;
            firstUnit = (block - args.routerBlocks) * neuronsPerBlock;
            width = args.sharedWidth;
            base = args.sharedGateUp;
        }
    }
    else
    {
        int const departmentBlocks = args.plan.counts[0] * args.departmentBlocksPerPart;
        int const expertBlocks = args.plan.counts[1] * args.expertBlocksPerPart;
        if (block < departmentBlocks)
        {
            int const part = block / args.departmentBlocksPerPart;
            kind = kKindDepartment;
            firstUnit = (block - part * args.departmentBlocksPerPart) * neuronsPerBlock;
            width = args.departmentWidth;
            base = args.departmentGateUp + static_cast<size_t>(args.plan.departments[part]) * 2 * width * d;
            entries = args.plan.departmentEntries + part * kMaxTileTokens;
            numTokens = args.plan.departmentEntryCounts[part];
        }
        else if (block - departmentBlocks < expertBlocks)
        {
            block -= departmentBlocks;
            int const part = block / args.expertBlocksPerPart;
            kind = kKindExpert;
            firstUnit = (block - part * args.expertBlocksPerPart) * neuronsPerBlock;
            width = args.expertWidth;
            base = args.expertGateUp + static_cast<size_t>(args.plan.experts[part]) * 2 * width * d;
            entries = args.plan.expertEntries + part * kMaxTileTokens;
            numTokens = args.plan.expertEntryCounts[part];
        }
        else
        {
            return; // beyond this tile's plan
        }
    }
    if (numTokens <= 0)
        return;

    int const unit = firstUnit + warp / args.slices;
    int const slice = warp % args.slices;
    bool const active = unit < width;

    int offset[TT];
#pragma unroll
    for (int t = 0; t < TT; ++t)
    {
        int const token = entries ? (t < numTokens ? entries[t].token : 0) : t;
        offset[t] = token * d;
    }

    float acc[2][TT];
#pragma unroll
    for (int r = 0; r < 2; ++r)
    {
#pragma unroll
        for (int t = 0; t < TT; ++t)
            acc[r][t] = 0.0f;
    }

    if (active)
    {
        T const* rows[2];
        if (kind == kKindRouter)
        {
            int const row0 = 2 * unit;
            int const row1 = row0 + 1 < args.routerRows ? row0 + 1 : row0; // odd count: recompute row0, unused
            rows[0] = row0 < args.numExperts ? args.routerWeight + static_cast<size_t>(row0) * d : args.sharedGateRow;
            rows[1] = row1 < args.numExperts ? args.routerWeight + static_cast<size_t>(row1) * d : args.sharedGateRow;
        }
        else
        {
            rows[0] = base + static_cast<size_t>(unit) * d;         // gate row
            rows[1] = base + static_cast<size_t>(width + unit) * d; // up row
        }
        int const chunksPerRow = d / E;
        int const begin = slice * args.chunksPerSlice;
        int const end = min(begin + args.chunksPerSlice, chunksPerRow);
        accumulateRows<T, T, 2, TT>(rows, begin, end, args.x, offset, numTokens, acc);
#pragma unroll
        for (int r = 0; r < 2; ++r)
        {
#pragma unroll
            for (int t = 0; t < TT; ++t)
            {
                if (t < numTokens)
                    acc[r][t] = warpSum(acc[r][t]);
            }
        }
        if (lane == 0)
        {
#pragma unroll
            for (int r = 0; r < 2; ++r)
            {
#pragma unroll
                for (int t = 0; t < TT; ++t)
                    partial[warp][r][t] = acc[r][t];
            }
        }
    }
    __syncthreads();

    // Epilogue: one thread per (neuron, token); slices summed in slice order.
    int const tid = static_cast<int>(threadIdx.x);
    if (tid >= neuronsPerBlock * numTokens)
        return;
    int const local = tid / numTokens;
    int const t = tid - local * numTokens;
    int const neuron = firstUnit + local;
    if (neuron >= width)
        return;
    float g = 0.0f;
    float u = 0.0f;
    for (int s = 0; s < args.slices; ++s)
    {
        g += partial[local * args.slices + s][0][t];
        u += partial[local * args.slices + s][1][t];
    }
    switch (kind)
    {
    case kKindRouter:
    {
        int const row0 = 2 * neuron;
        args.logits[t * args.logitsStride + row0] = g;
        if (row0 + 1 < args.routerRows)
            args.logits[t * args.logitsStride + row0 + 1] = u;
        break;
    }
    case kKindShared: args.hShared[t * args.sharedWidth + neuron] = silu(g) * u; break;
    case kKindDepartment:
    {
        PlanEntry const entry = entries[t];
        args.hDepartment[(entry.token * args.departmentSlots + entry.slot) * width + neuron]
            = entry.weight * (silu(g) * u);
        break;
    }
    default:
    {
        PlanEntry const entry = entries[t];
        args.hExpert[(entry.token * args.topK + entry.slot) * width + neuron] = entry.weight * (silu(g) * u);
        break;
    }
    }
}

// ---------------------------------------------------------------------------------------
// Down rows of one part for its tokens -> per-(token, slot) partials.

// Computes kDownRowsPerWarp rows (firstRow, firstRow + 1, ...) of down [d][f] for the
// part's tokens (activation rows h + offset[t]) and hands each result to
// store(t, row, value), called by one lane per value.
template <class T, int TT, class Store>
DEAMOE_DEVICE void downRows(T const* down, int width, int hidden, int firstRow, float const* h, int const (&offset)[TT],
    int numTokens, Store const& store)
{
    constexpr int E = Elems16<T>::value;
    constexpr int R = kDownRowsPerWarp;
    static_assert(R * TT <= kWarpSize, "one lane per stored value");
    int const lane = static_cast<int>(threadIdx.x) & (kWarpSize - 1);
    T const* rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r)
        rows[r] = down + static_cast<size_t>(min(firstRow + r, hidden - 1)) * width;
    float acc[R][TT];
#pragma unroll
    for (int r = 0; r < R; ++r)
    {
#pragma unroll
        for (int t = 0; t < TT; ++t)
            acc[r][t] = 0.0f;
    }
    accumulateRows<T, float, R, TT>(rows, 0, width / E, h, offset, numTokens, acc);
#pragma unroll
    for (int r = 0; r < R; ++r)
    {
#pragma unroll
        for (int t = 0; t < TT; ++t)
        {
            if (t < numTokens)
            {
                float const value = warpSum(acc[r][t]);
                if (lane == r * TT + t && firstRow + r < hidden)
                    store(t, firstRow + r, value);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// K2: routing + plan (block 0), shared experts' down (blocks 1..)

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
struct RoutePlanArgs
{
    RoutingConfig routing;
    PlanConfig planConfig;
    float const* logits; // [tile][logitsStride]
    int32_t logitsStride;
    float const* routerBias; // [N] float32 or nullptr
    int32_t numTokens;
    int32_t routingWarps; // warps of block 0 that route (each owns one scratch area)
    PlanView plan;
    int32_t* counters; // [numCounters], zeroed here for K4
    int32_t numCounters;
    // Shared experts' down (blocks 1..)
    T const* sharedDown; // [d][f_sh] or nullptr
    int32_t hidden;
    int32_t sharedWidth;
    float const* hShared; // [tile][f_sh]
    int32_t sharedGate;   // 1: scale by sigmoid(logit column N)
    float* partials;      // [tile][S][d]
    int32_t partialSlots; // S
    int32_t sharedSlot;   // S - 1
};

template <class T, int TT>
__global__ void __launch_bounds__(kRoutePlanThreads, 1) routePlanKernel(RoutePlanArgs<T> const args)
{
    beginDependentKernel();
    int const warp = static_cast<int>(threadIdx.x) / kWarpSize;

    if (blockIdx.x == 0)
    {
        RoutingConfig const& cfg = args.routing;
        int const k = cfg.topK;
        int const g = cfg.topDepartments;
        int const scratchFloats = routingScratchFloats(cfg);
        float* smem = dynamicSmem();
        int32_t* expertIds = reinterpret_cast<int32_t*>(smem);        // [tile][k]
        float* weights = smem + kMaxTileTokens * k;                    // [tile][k]
        int32_t* departmentIds = expertIds + 2 * kMaxTileTokens * k;   // [tile][k]
        int32_t* kept = expertIds + 3 * kMaxTileTokens * k;            // [tile][g]
        uint32_t* planScratch = reinterpret_cast<uint32_t*>(kept + kMaxTileTokens * g); // [N + D]
        float* routingScratch = reinterpret_cast<float*>(planScratch + planScratchWords(args.planConfig));

        if (warp < args.routingWarps)
        {
            float* scratch = routingScratch + warp * scratchFloats;
            for (int t = warp; t < args.numTokens; t += args.routingWarps)
            {
                routeToken(WarpLanes{}, cfg, args.logits + t * args.logitsStride, DeviceBias<float>{args.routerBias},
                    scratch, expertIds + t * k, weights + t * k, departmentIds + t * k, kept + t * g);
            }
        }
        for (int i = static_cast<int>(threadIdx.x); i < args.numCounters; i += kRoutePlanThreads)
            args.counters[i] = 0;
        __syncthreads();
        buildPlan(BlockLanes{}, WarpLanes{}, warp == 0, args.planConfig, args.numTokens, expertIds, weights, kept,
            planScratch, args.plan);
        return;
    }

    // Shared experts' down: rows of this block, all tokens of the tile.
    int const firstRow = (static_cast<int>(blockIdx.x) - 1) * kSharedDownRowsPerBlock + warp * kDownRowsPerWarp;
    if (firstRow >= args.hidden)
        return;
    int offset[TT];
#pragma unroll
    for (int t = 0; t < TT; ++t)
        offset[t] = t * args.sharedWidth;
    auto store = [&args](int t, int row, float value) {
        if (args.sharedGate)
            value *= sigmoid(args.logits[t * args.logitsStride + args.routing.numExperts]);
        args.partials[static_cast<size_t>(t * args.partialSlots + args.sharedSlot) * args.hidden + row] = value;
    };
    downRows<T, TT>(args.sharedDown, args.sharedWidth, args.hidden, firstRow, args.hShared, offset, args.numTokens, store);
}

// ---------------------------------------------------------------------------------------
// K4: down of every used part + fused, ordered reduction

template <class T>
struct DownArgs
{
    PlanView plan;
    int32_t hidden;
    int32_t numTokens;
    int32_t tiles; // ceil(d / kDownRowsPerTile)
    T const* departmentDown; // [D][d][f_s] or nullptr
    int32_t departmentWidth;
    float const* hDepartment;
    int32_t departmentSlots; // min(g, k)
    T const* expertDown; // [N][d][f_p] or nullptr
    int32_t expertWidth;
    float const* hExpert;
    int32_t topK;
    float* partials; // [tile][S][d]
    int32_t partialSlots;
    int32_t hasShared; // partial slot S - 1 holds the shared experts' output
    int32_t* counters; // [tiles], zeroed by K2
    T* output;         // [tile][d]
};

// Blocks per SM the down kernel asks ptxas to fit: without a hint ptxas stops at 128
// registers for TT = 16 on sm_110 and spills; the hint lets it use up to 170 there.
template <int TT>
struct DownMinBlocks
{
    static constexpr int value = TT >= 16 ? 3 : 4;
};

template <class T, int TT>
__global__ void __launch_bounds__(kGemvThreads, DownMinBlocks<TT>::value) downKernel(DownArgs<T> const args)
{
    beginDependentKernel();
    __shared__ int isLast;
    int const warp = static_cast<int>(threadIdx.x) / kWarpSize;
    int const d = args.hidden;
    int const usedDepartments = args.departmentWidth ? args.plan.counts[0] : 0;
    int const usedExperts = args.expertWidth ? args.plan.counts[1] : 0;
    int const departmentBlocks = usedDepartments * args.tiles;
    int block = static_cast<int>(blockIdx.x);
    if (block >= departmentBlocks + usedExperts * args.tiles)
        return; // beyond this tile's plan

    // W_j and w_e are already folded into h: the partial is the plain dot product.
    int tile;
    int numTokens;
    int offset[TT];
    T const* down;
    float const* h;
    int width;
    int slotsPerToken; // h's slots per token
    int slotBase;      // first partial slot of this kind
    PlanEntry const* entries;
    if (block < departmentBlocks)
    {
        int const part = block / args.tiles;
        tile = block - part * args.tiles;
        width = args.departmentWidth;
        down = args.departmentDown + static_cast<size_t>(args.plan.departments[part]) * d * width;
        h = args.hDepartment;
        slotsPerToken = args.departmentSlots;
        slotBase = args.topK;
        numTokens = args.plan.departmentEntryCounts[part];
        entries = args.plan.departmentEntries + part * kMaxTileTokens;
    }
    else
    {
        block -= departmentBlocks;
        int const part = block / args.tiles;
        tile = block - part * args.tiles;
        width = args.expertWidth;
        down = args.expertDown + static_cast<size_t>(args.plan.experts[part]) * d * width;
        h = args.hExpert;
        slotsPerToken = args.topK;
        slotBase = 0;
        numTokens = args.plan.expertEntryCounts[part];
        entries = args.plan.expertEntries + part * kMaxTileTokens;
    }
#pragma unroll
    for (int t = 0; t < TT; ++t)
    {
        PlanEntry const entry = t < numTokens ? entries[t] : PlanEntry{0, 0, 0.0f};
        offset[t] = (entry.token * slotsPerToken + entry.slot) * width;
    }

    int const firstRow = tile * kDownRowsPerTile + warp * kDownRowsPerWarp;
    if (firstRow < d)
    {
        auto store = [&](int t, int row, float value) {
            PlanEntry const entry = entries[t];
            args.partials[static_cast<size_t>(entry.token * args.partialSlots + slotBase + entry.slot) * d + row] = value;
        };
        downRows<T, TT>(down, width, d, firstRow, h, offset, numTokens, store);
    }

    // The last of the tile's blocks (one per used part) sums its partials. Threadfence
    // reduction: make this block's partials visible, then count it in.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
    {
        int const expected = usedDepartments + usedExperts;
        isLast = atomicAdd(args.counters + tile, 1) == expected - 1;
    }
    __syncthreads();
    if (!isLast)
        return;
    __threadfence();

    // One thread per (token, row) of the tile: kDownRowsPerTile * kMaxTileTokens == threads.
    static_assert(kDownRowsPerTile * kMaxTileTokens == kGemvThreads, "reduction mapping");
    int const t = static_cast<int>(threadIdx.x) / kDownRowsPerTile;
    int const row = tile * kDownRowsPerTile + static_cast<int>(threadIdx.x) % kDownRowsPerTile;
    if (t >= args.numTokens || row >= d)
        return;
    // Fixed order: experts in selection order, then departments, then shared experts.
    // __ldcg: read at L2, where the other blocks' partials are (L1 is not coherent).
    float const* p = args.partials + static_cast<size_t>(t) * args.partialSlots * d + row;
    float sum = 0.0f;
    if (args.expertWidth)
    {
        for (int s = 0; s < args.topK; ++s)
            sum += __ldcg(p + static_cast<size_t>(s) * d);
    }
    if (args.departmentWidth)
    {
        int const slots = args.plan.departmentSlots[t];
        for (int s = 0; s < slots; ++s)
            sum += __ldcg(p + static_cast<size_t>(args.topK + s) * d);
    }
    if (args.hasShared)
        sum += __ldcg(p + static_cast<size_t>(args.partialSlots - 1) * d);
    args.output[static_cast<size_t>(t) * d + row] = fromFloat<T>(sum);
}

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
};

template <class T, int TT>
__global__ void __launch_bounds__(kGemvThreads) routerRowsFloatKernel(RouterRowsArgs<T> const args)
{
    beginDependentKernel();
    int const lane = static_cast<int>(threadIdx.x) & (kWarpSize - 1);
    int const row = static_cast<int>(blockIdx.x) * kGemvWarps + static_cast<int>(threadIdx.x) / kWarpSize;
    if (row >= args.numExperts)
        return;
    float const* w = args.routerWeight + static_cast<size_t>(row) * args.hidden;
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
        float const sum = warpSum(acc[t]);
        if (lane == 0 && t < args.numTokens)
            args.logits[static_cast<size_t>(t) * args.logitsStride + row] = sum;
    }
}

// ---------------------------------------------------------------------------------------
// Host side: launch geometry and the typed entry points.

inline int ceilDiv(int a, int b)
{
    return (a + b - 1) / b;
}

#if defined(__CUDACC__)
// Launches kernel<<<grid, block, smem, stream>>>(args), as a programmatic dependent of the
// stream's previous kernel when that is enabled and the GPU is sm_90 or newer. Returns the
// launch's result, for checkLaunch().
template <class Args>
cudaError_t launchKernel(void (*kernel)(Args), unsigned grid, unsigned block, size_t smem, cudaStream_t stream,
    Args const& args)
{
    cudaLaunchAttribute attribute[1];
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(grid);
    config.blockDim = dim3(block);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    if (programmaticLaunchUsable())
    {
        attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attribute[0].val.programmaticStreamSerializationAllowed = 1;
        config.attrs = attribute;
        config.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&config, kernel, args);
}
#endif

template <class T>
struct Geometry
{
    int slices;
    int chunksPerSlice;
    int neuronsPerBlock;

    explicit Geometry(int hidden)
    {
        int const chunksPerRow = hidden / Elems16<T>::value;
        // Split a row over more warps when one warp's share would exceed 256 chunks
        // (4 KiB): short per-warp streams keep the tail of each launch short.
        slices = 1;
        while (slices < kGemvWarps && chunksPerRow > 256 * slices)
            slices *= 2;
        chunksPerSlice = ceilDiv(chunksPerRow, slices);
        neuronsPerBlock = kGemvWarps / slices;
    }
};

// K1: router rows in the activation dtype (numExperts of them, 0 for none) and the shared
// experts' gate row (logit column numExperts) and gate/up.
template <class T, int TT>
Status launchGateUpK1(LayerParams const& p, T const* hidden, T const* routerWeight, int numExperts,
    T const* sharedGate, int numTokens, float* logits, int logitsStride, T const* sharedGateUp, float* hShared,
    cudaStream_t stream)
{
    Geometry<T> const geo(p.hidden);
    GateUpArgs<T> args{};
    args.x = hidden;
    args.hidden = p.hidden;
    args.numTokens = numTokens;
    args.slices = geo.slices;
    args.chunksPerSlice = geo.chunksPerSlice;
    args.routedMode = 0;
    args.routerWeight = routerWeight;
    args.numExperts = numExperts;
    args.sharedGateRow = sharedGate;
    args.routerRows = args.numExperts + (sharedGate ? 1 : 0);
    args.logits = logits;
    args.logitsStride = logitsStride;
    args.routerBlocks = ceilDiv(ceilDiv(args.routerRows, 2), geo.neuronsPerBlock);
    args.sharedGateUp = sharedGateUp;
    args.sharedWidth = sharedGateUp ? p.sharedExpertWidth : 0;
    args.hShared = hShared;
    int const sharedBlocks = sharedGateUp ? ceilDiv(p.sharedExpertWidth, geo.neuronsPerBlock) : 0;
    return checkLaunch("router/shared gate-up kernel",
        DEAMOE_LAUNCH((gateUpKernel<T, TT>), args.routerBlocks + sharedBlocks, kGemvThreads, 0, stream, args));
}

template <class T, int TT>
Status launchRouterLogits(LayerParams const& p, T const* hidden, void const* routerWeight, T const* sharedGate,
    int numTokens, float* logits, int logitsStride, T const* sharedGateUp, float* hShared, cudaStream_t stream)
{
    int const numExperts = p.numDepartments * p.expertsPerDepartment;
    if (p.routerWeightFloat32 && !std::is_same<T, float>::value)
    {
        // Float32 router rows on their own; K1 below then does only the shared experts'
        // gate row (as logit column N) and gate/up.
        RouterRowsArgs<T> rows{hidden, static_cast<float const*>(routerWeight), p.hidden, numExperts, numTokens,
            logits, logitsStride};
        Status const status = checkLaunch("float32 router kernel",
            DEAMOE_LAUNCH((routerRowsFloatKernel<T, TT>), ceilDiv(numExperts, kGemvWarps), kGemvThreads, 0,
                stream, rows));
        if (status != Status::kSUCCESS || (sharedGate == nullptr && sharedGateUp == nullptr))
            return status;
        return launchGateUpK1<T, TT>(p, hidden, nullptr, 0, sharedGate, numTokens, logits + numExperts, logitsStride,
            sharedGateUp, hShared, stream);
    }
    return launchGateUpK1<T, TT>(p, hidden, static_cast<T const*>(routerWeight), numExperts, sharedGate, numTokens,
        logits, logitsStride, sharedGateUp, hShared, stream);
}

template <class T, int TT>
Status forwardTile(LayerParams const& p, LayerWeights const& w, T const* hidden, T* output, int numTokens,
    WorkspaceLayout const& L, char* ws, cudaStream_t stream)
{
    int const d = p.hidden;
    int const k = p.topK;
    Geometry<T> const geo(d);
    float* logits = reinterpret_cast<float*>(ws + L.logits);
    float* hShared = reinterpret_cast<float*>(ws + L.hShared);
    float* partials = reinterpret_cast<float*>(ws + L.partials);
    int32_t* counters = reinterpret_cast<int32_t*>(ws + L.counters);
    PlanView const plan{reinterpret_cast<int32_t*>(ws + L.counts), reinterpret_cast<int32_t*>(ws + L.departments),
        reinterpret_cast<int32_t*>(ws + L.experts), reinterpret_cast<int32_t*>(ws + L.departmentEntryCounts),
        reinterpret_cast<int32_t*>(ws + L.expertEntryCounts), reinterpret_cast<PlanEntry*>(ws + L.departmentEntries),
        reinterpret_cast<PlanEntry*>(ws + L.expertEntries), reinterpret_cast<int32_t*>(ws + L.departmentSlots)};
    T const* sharedGateUp = p.sharedExpertWidth ? static_cast<T const*>(w.sharedGateUp) : nullptr;
    T const* sharedGate = p.sharedExpertGate ? static_cast<T const*>(w.sharedGate) : nullptr;

    // K1
    Status status = launchRouterLogits<T, TT>(p, hidden, w.routerWeight, sharedGate, numTokens,
        logits, L.logitsStride, sharedGateUp, hShared, stream);
    if (status != Status::kSUCCESS)
        return status;

    // K2
    {
        RoutePlanArgs<T> args{};
        args.routing = routingConfig(p);
        args.planConfig = planConfig(p);
        args.logits = logits;
        args.logitsStride = L.logitsStride;
        args.routerBias = p.hasRouterBias ? static_cast<float const*>(w.routerBias) : nullptr;
        args.numTokens = numTokens;
        size_t const perWarp = sizeof(float) * routingScratchFloats(args.routing);
        size_t const fixed = routePlanSmemBytes(p, 0);
        args.routingWarps = static_cast<int>(std::min<size_t>(
            std::min(numTokens, kRoutePlanWarps), (kSmemBudget - std::min(fixed, kSmemBudget)) / perWarp));
        if (args.routingWarps < 1) // checkSupported() refuses such layers before anything launches
            return fail(Status::kUNSUPPORTED, "num_experts %d needs more shared memory for routing than %zu bytes",
                args.routing.numExperts, kSmemBudget);
        args.plan = plan;
        args.counters = counters;
        args.numCounters = L.downTiles;
        args.sharedDown = p.sharedExpertWidth ? static_cast<T const*>(w.sharedDown) : nullptr;
        args.hidden = d;
        args.sharedWidth = p.sharedExpertWidth;
        args.hShared = hShared;
        args.sharedGate = p.sharedExpertGate;
        args.partials = partials;
        args.partialSlots = L.partialSlots;
        args.sharedSlot = L.partialSlots - 1;
        int const blocks = 1 + (p.sharedExpertWidth ? ceilDiv(d, kSharedDownRowsPerBlock) : 0);
        status = checkLaunch("routing/plan kernel",
            DEAMOE_LAUNCH((routePlanKernel<T, TT>), blocks, kRoutePlanThreads,
                routePlanSmemBytes(p, args.routingWarps), stream, args));
        if (status != Status::kSUCCESS)
            return status;
    }

    // K3
    {
        GateUpArgs<T> args{};
        args.x = hidden;
        args.hidden = d;
        args.numTokens = numTokens;
        args.slices = geo.slices;
        args.chunksPerSlice = geo.chunksPerSlice;
        args.routedMode = 1;
        args.plan = plan;
        args.departmentGateUp = static_cast<T const*>(w.departmentGateUp);
        args.departmentWidth = p.sharedWidth;
        args.hDepartment = reinterpret_cast<float*>(ws + L.hDepartment);
        args.departmentSlots = L.departmentSlotsPerToken;
        args.departmentBlocksPerPart = p.sharedWidth ? ceilDiv(p.sharedWidth, geo.neuronsPerBlock) : 0;
        args.expertGateUp = static_cast<T const*>(w.expertGateUp);
        args.expertWidth = p.privateWidth;
        args.hExpert = reinterpret_cast<float*>(ws + L.hExpert);
        args.topK = k;
        args.expertBlocksPerPart = p.privateWidth ? ceilDiv(p.privateWidth, geo.neuronsPerBlock) : 0;
        long long const blocks = static_cast<long long>(L.maxDepartmentParts) * args.departmentBlocksPerPart
            + static_cast<long long>(L.maxExpertParts) * args.expertBlocksPerPart;
        status = checkLaunch("routed gate-up kernel",
            DEAMOE_LAUNCH((gateUpKernel<T, TT>), static_cast<unsigned>(blocks), kGemvThreads, 0, stream, args));
        if (status != Status::kSUCCESS)
            return status;
    }

    // K4
    {
        DownArgs<T> args{};
        args.plan = plan;
        args.hidden = d;
        args.numTokens = numTokens;
        args.tiles = L.downTiles;
        args.departmentDown = static_cast<T const*>(w.departmentDown);
        args.departmentWidth = p.sharedWidth;
        args.hDepartment = reinterpret_cast<float const*>(ws + L.hDepartment);
        args.departmentSlots = L.departmentSlotsPerToken;
        args.expertDown = static_cast<T const*>(w.expertDown);
        args.expertWidth = p.privateWidth;
        args.hExpert = reinterpret_cast<float const*>(ws + L.hExpert);
        args.topK = k;
        args.partials = partials;
        args.partialSlots = L.partialSlots;
        args.hasShared = p.sharedExpertWidth > 0;
        args.counters = counters;
        args.output = output;
        long long const parts = (p.sharedWidth ? L.maxDepartmentParts : 0) + (p.privateWidth ? L.maxExpertParts : 0);
        status = checkLaunch("down kernel",
            DEAMOE_LAUNCH((downKernel<T, TT>), static_cast<unsigned>(parts * L.downTiles), kGemvThreads, 0,
                stream, args));
    }
    return status;
}

// Token capacity of the kernels for a tile of n tokens: the next power of two.
template <class F>
Status dispatchTileTokens(int n, F&& f)
{
    if (n <= 1)
        return f(std::integral_constant<int, 1>{});
    if (n <= 2)
        return f(std::integral_constant<int, 2>{});
    if (n <= 4)
        return f(std::integral_constant<int, 4>{});
    if (n <= 8)
        return f(std::integral_constant<int, 8>{});
    return f(std::integral_constant<int, 16>{});
}

template <class T>
Status forwardTyped(LayerParams const& p, LayerWeights const& w, void const* hidden, void* output, int32_t numTokens,
    void* workspace, cudaStream_t stream)
{
    WorkspaceLayout const L = workspaceLayout(p, std::min(numTokens, kMaxTileTokens));
    char* ws = static_cast<char*>(workspace);
    for (int first = 0; first < numTokens; first += kMaxTileTokens)
    {
        int const n = std::min(kMaxTileTokens, numTokens - first);
        T const* x = static_cast<T const*>(hidden) + static_cast<size_t>(first) * p.hidden;
        T* y = static_cast<T*>(output) + static_cast<size_t>(first) * p.hidden;
        Status const status = dispatchTileTokens(n, [&](auto tt) {
            return forwardTile<T, decltype(tt)::value>(p, w, x, y, n, L, ws, stream);
        });
        if (status != Status::kSUCCESS)
            return status;
    }
    return Status::kSUCCESS;
}

template <class T>
Status launchRoute(LayerParams const& p, float const* logits, int logitsStride, void const* routerBias, int numTokens,
    RoutingOutputs const& out, cudaStream_t stream)
{
    RouteArgs<T> args{};
    args.routing = routingConfig(p);
    args.logits = logits;
    args.logitsStride = logitsStride;
    args.routerBias = p.hasRouterBias ? static_cast<float const*>(routerBias) : nullptr;
    args.numTokens = numTokens;
    args.out = out;
    int const warpsPerBlock = kRouteThreads / kWarpSize;
    size_t const smem = sizeof(float) * routingScratchFloats(args.routing) * warpsPerBlock;
    if (smem > kSmemBudget)
        return fail(Status::kUNSUPPORTED, "num_experts %d needs more shared memory for routing than %zu bytes",
            args.routing.numExperts, kSmemBudget);
    return checkLaunch("routing kernel",
        DEAMOE_LAUNCH((routeKernel<T>), ceilDiv(numTokens, warpsPerBlock), kRouteThreads, smem, stream, args));
}

inline RoutingOutputs offsetOutputs(RoutingOutputs const& out, LayerParams const& p, int first)
{
    return RoutingOutputs{out.expertIds + first * p.topK, out.weights + first * p.topK,
        out.departmentIds + first * p.topK, out.keptDepartments + first * p.topDepartments};
}

template <class T>
Status routeTyped(LayerParams const& p, void const* hidden, void const* routerWeight, void const* routerBias,
    int32_t numTokens, RoutingOutputs const& out, void* workspace, cudaStream_t stream)
{
    int const N = p.numDepartments * p.expertsPerDepartment;
    float* logits = static_cast<float*>(workspace);
    for (int first = 0; first < numTokens; first += kMaxTileTokens)
    {
        int const n = std::min(kMaxTileTokens, numTokens - first);
        T const* x = static_cast<T const*>(hidden) + static_cast<size_t>(first) * p.hidden;
        Status status = dispatchTileTokens(n, [&](auto tt) {
            return launchRouterLogits<T, decltype(tt)::value>(
                p, x, routerWeight, nullptr, n, logits, N, nullptr, nullptr, stream);
        });
        if (status == Status::kSUCCESS)
            status = launchRoute<T>(p, logits, N, routerBias, n, offsetOutputs(out, p, first), stream);
        if (status != Status::kSUCCESS)
            return status;
    }
    return Status::kSUCCESS;
}

template <class T>
Status routerLogitsTyped(
    LayerParams const& p, void const* hidden, void const* routerWeight, int32_t numTokens, float* logits, cudaStream_t stream)
{
    int const N = p.numDepartments * p.expertsPerDepartment;
    for (int first = 0; first < numTokens; first += kMaxTileTokens)
    {
        int const n = std::min(kMaxTileTokens, numTokens - first);
        T const* x = static_cast<T const*>(hidden) + static_cast<size_t>(first) * p.hidden;
        Status const status = dispatchTileTokens(n, [&](auto tt) {
            return launchRouterLogits<T, decltype(tt)::value>(p, x, routerWeight, nullptr, n,
                logits + static_cast<size_t>(first) * N, N, nullptr, nullptr, stream);
        });
        if (status != Status::kSUCCESS)
            return status;
    }
    return Status::kSUCCESS;
}

template <class T>
Status routeLogitsTyped(LayerParams const& p, float const* logits, void const* routerBias, int32_t numTokens,
    RoutingOutputs const& out, cudaStream_t stream)
{
    int const N = p.numDepartments * p.expertsPerDepartment;
    return launchRoute<T>(p, logits, N, routerBias, numTokens, out, stream);
}

template <class T>
TypedOps const& typedOps()
{
    static TypedOps const ops{&forwardTyped<T>, &routeTyped<T>, &routerLogitsTyped<T>, &routeLogitsTyped<T>};
    return ops;
}

} // namespace detail
} // namespace deamoe
