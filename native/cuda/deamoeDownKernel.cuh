/*
 * K3 of the DeaMoE forward (deamoeForward.cuh): the down projection of every used part,
 * owned by output row tile.
 */
#pragma once

#include "deamoeGemv.cuh"

namespace deamoe
{
namespace detail
{

// ---------------------------------------------------------------------------------------
// K3: down of every used part, owned by output row tile

template <class T>
struct DownArgs
{
    PlanView plan;
    int32_t hidden;
    int32_t numTokens;
    T const* departmentDown; // [D][d][f_s] or nullptr
    int32_t departmentWidth;
    float const* hDepartment;    // [tile][min(g,k)][f_s]
    int32_t departmentSlots;     // min(g, k)
    T const* expertDown;         // [N][d][f_p] or nullptr
    T const* expertDownBias;     // [N][d] or nullptr: each kept expert's, times its routing weight
    int32_t const* expertIds;    // [tile][k]: the tile's routing (read with expertDownBias)
    float const* routingWeights; // [tile][k]
    int32_t expertWidth;
    float const* hExpert; // [tile][k][f_p]
    int32_t topK;
    float const* sharedOut; // [tile][d] or nullptr
    T* output;              // [tile][d]
    // Quantized FFN weights (downKernel's BITS > 0): codes and scales instead of the T
    // down matrices above.
    int32_t groupShift;                 // log2(weightGroupSize)
    uint8_t const* departmentDownCodes; // [D][d][f_s * BITS / 8]
    T const* departmentDownScales;      // [D][d][f_s / G]
    uint8_t const* expertDownCodes;     // [N][d][f_p * BITS / 8]
    T const* expertDownScales;          // [N][d][f_p / G]
};

// Blocks per SM the down kernel asks ptxas to fit. Every down block streams the same
// bytes, so a grid that does not fit in one wave leaves a tail at a fraction of the
// bandwidth: 7 blocks of <= 73 registers for 1 token put deepseek-v3-layer's 896 row
// tiles in one wave on an H100/H200 (132 SMs; 8 blocks of 64 registers spill, as do 7
// for 2 tokens in fp16). Wider tiles need the registers: 3 keeps the 16-token variant
// from spilling on sm_110.
// Quantized rows (BITS > 0) need a few more registers (codes, scales, the 8-weight partial):
// int4 at 2 tokens spills at 6 blocks (80 registers), so it asks for 5.
template <int TT, int BITS>
struct DownMinBlocks
{
    static constexpr int value = TT == 1 ? 7 : (TT == 2 ? (BITS == 4 ? 5 : 6) : (TT >= 16 ? 3 : 4));
};

// Dynamic shared memory of the staged-down variant: one part's h for TT tokens in the
// activation dtype, at the widest part's width.
template <class T>
size_t stagedDownSmemBytes(int tileTokens, int departmentWidth, int expertWidth)
{
    return static_cast<size_t>(tileTokens) * static_cast<size_t>(std::max(departmentWidth, expertWidth)) * sizeof(T);
}

// The staged-down variant: the block copies part q's h of each of its tokens (float32,
// global) into shared memory, rounded to T, token t at staged + t * width; offset[t] becomes
// t * width for the tokens that use the part, -1 for the others. Called by every thread.
template <class T, int TT>
DEAMOE_DEVICE void stagePartActivations(
    float const* h, int const (&partOffset)[TT], int width, T* staged, int (&offset)[TT])
{
    int const tid = static_cast<int>(threadIdx.x);
    if (tid < TT)
        offset[tid] = partOffset[tid] >= 0 ? tid * width : -1;
    int const vectors = width / 4; // widths are multiples of 16 (int8 rows) or of 32 (int4)
    for (int i = tid; i < TT * vectors; i += kGemvThreads)
    {
        int const t = i / vectors;
        int const j = 4 * (i - t * vectors);
        int const from = partOffset[t];
        if (from >= 0)
        {
            float4 const v = *reinterpret_cast<float4 const*>(h + from + j);
            T* const to = staged + t * width + j;
            to[0] = fromFloat<T>(v.x);
            to[1] = fromFloat<T>(v.y);
            to[2] = fromFloat<T>(v.z);
            to[3] = fromFloat<T>(v.w);
        }
    }
}

// Each block owns kDownRowsPerTile output rows and streams those rows of every used part
// (experts in plan order, then departments), adding each part's dot products into the
// tokens' accumulators (W_j and w_e are already folded into h), then the shared experts'
// output. The parts' metadata is staged in shared memory kDownPartsPerGroup at a time.
// STAGED (the staged-down variant): each part's h is copied once per block into shared
// memory in T (stagePartActivations), so the 4 warps read it from there rather than each
// through L1 in float32, and quantized rows of at most 16 chunks take whole warps
// (accumulateQuantRowsNarrow).
template <class T, int TT, int BITS, bool STAGED = false, bool BIT_DEQUANT = false>
__global__ void __launch_bounds__(kGemvThreads, DownMinBlocks<TT, BITS>::value) downKernel(DownArgs<T> const args)
{
    beginDependentKernel();
    constexpr int E = Elems16<T>::value;
    constexpr int G = kDownPartsPerGroup;
    constexpr int R = kDownRowsPerWarp;
    __shared__ T const* partDown[G];     // the part's down matrix [d][width]
    __shared__ QuantRow<T> partQuant[G]; // BITS > 0: its codes and scales instead
    __shared__ float const* partH[G];
    __shared__ int partWidth[G];
    __shared__ int partOffset[G][TT]; // h offset of each token in the part, -1: not used

    int const tid = static_cast<int>(threadIdx.x);
    int const warp = tid / kWarpSize;
    int const d = args.hidden;
    int const firstRow = static_cast<int>(blockIdx.x) * kDownRowsPerTile + warp * R;
    int const usedExperts = args.expertWidth ? args.plan.counts[1] : 0;
    int const usedDepartments = args.departmentWidth ? args.plan.counts[0] : 0;
    int const parts = usedExperts + usedDepartments;

    float acc[R][TT] = {};
    for (int first = 0; first < parts; first += G)
    {
        int const n = min(G, parts - first);
        __syncthreads(); // the previous group is consumed
        for (int i = tid; i < G * TT; i += kGemvThreads)
            (&partOffset[0][0])[i] = -1;
        for (int q = tid; q < n; q += kGemvThreads)
        {
            int const p = first + q;
            bool const expert = p < usedExperts;
            int const width = expert ? args.expertWidth : args.departmentWidth;
            int const id = expert ? args.plan.experts[p] : args.plan.departments[p - usedExperts];
            partDown[q] = (expert ? args.expertDown : args.departmentDown) + static_cast<size_t>(id) * d * width;
            if constexpr (BITS > 0)
                partQuant[q] = quantRow<BITS>(expert ? args.expertDownCodes : args.departmentDownCodes,
                    expert ? args.expertDownScales : args.departmentDownScales, static_cast<size_t>(id) * d, width,
                    args.groupShift);
            partH[q] = expert ? args.hExpert : args.hDepartment;
            partWidth[q] = width;
        }
        __syncthreads();
        for (int i = tid; i < n * kMaxTileTokens; i += kGemvThreads)
        {
            int const p = first + i / kMaxTileTokens;
            int const e = i % kMaxTileTokens;
            bool const expert = p < usedExperts;
            int const part = expert ? p : p - usedExperts;
            int const count = expert ? args.plan.expertEntryCounts[part] : args.plan.departmentEntryCounts[part];
            if (e < count)
            {
                PlanEntry const entry
                    = (expert ? args.plan.expertEntries : args.plan.departmentEntries)[part * kMaxTileTokens + e];
                int const slots = expert ? args.topK : args.departmentSlots;
                partOffset[i / kMaxTileTokens][entry.token]
                    = (entry.token * slots + entry.slot) * (expert ? args.expertWidth : args.departmentWidth);
            }
        }
        __syncthreads();
        if constexpr (STAGED)
        {
            T* const staged = reinterpret_cast<T*>(dynamicSmem());
            __shared__ int stagedOffset[TT];
            for (int q = 0; q < n; ++q)
            {
                int const width = partWidth[q];
                __syncthreads(); // the previous part's activations are consumed
                stagePartActivations<T, TT>(partH[q], partOffset[q], width, staged, stagedOffset);
                __syncthreads();
                if (firstRow >= d)
                    continue;
                uint32_t tokens = 0u;
#pragma unroll
                for (int t = 0; t < TT; ++t)
                    tokens |= stagedOffset[t] >= 0 ? 1u << t : 0u;
                if constexpr (BITS > 0)
                {
                    QuantRow<T> rows[R];
                    downQuantRows<BITS>(
                        partQuant[q].codes, partQuant[q].scales, width, d, args.groupShift, firstRow, rows);
                    int const chunks = width * BITS / 128;
                    if (2 * chunks <= kWarpSize)
                        accumulateQuantRowsNarrow<BITS, T, T, R, TT, true, BIT_DEQUANT>(
                            rows, args.groupShift, chunks, staged, stagedOffset, tokens, acc);
                    else
                        accumulateQuantRows<BITS, kQuantUnroll, T, T, R, TT, true, BIT_DEQUANT>(
                            rows, args.groupShift, 0, chunks, staged, stagedOffset, tokens, acc);
                }
                else
                {
                    T const* rows[R];
                    downRowPointers(partDown[q], width, d, firstRow, rows);
                    accumulateRows<T, T, R, TT, true>(rows, 0, width / E, staged, stagedOffset, tokens, acc);
                }
            }
        }
        else if (firstRow < d)
        {
            for (int q = 0; q < n; ++q)
            {
                int const width = partWidth[q];
                uint32_t tokens = 0u;
#pragma unroll
                for (int t = 0; t < TT; ++t)
                    tokens |= partOffset[q][t] >= 0 ? 1u << t : 0u;
                // The offsets stay in shared memory (a broadcast read per use), not in 16
                // registers of the widest tile.
                if constexpr (BITS > 0)
                {
                    QuantRow<T> rows[R];
                    downQuantRows<BITS>(
                        partQuant[q].codes, partQuant[q].scales, width, d, args.groupShift, firstRow, rows);
                    accumulateQuantRows<BITS, kQuantUnroll, T, float, R, TT, false, BIT_DEQUANT>(
                        rows, args.groupShift, 0, width * BITS / 128, partH[q], partOffset[q], tokens, acc);
                }
                else
                {
                    T const* rows[R];
                    downRowPointers(partDown[q], width, d, firstRow, rows);
                    accumulateRows<T, float, R, TT>(rows, 0, width / E, partH[q], partOffset[q], tokens, acc);
                }
            }
        }
    }
    if (firstRow >= d)
        return;
    if (args.expertDownBias)
    {
        // The experts' down biases of the warp's rows, weighted as their outputs:
        // w_e (h W^T + b) = (w_e h) W^T + w_e b, summed over each token's k experts in slot
        // order, once the rows are streamed: lane r * TT + t adds (row r, token t)'s to its
        // accumulator and the warp sum below carries it (before the loop, it would keep the
        // accumulators live through it: K3 runs at its register limit, 7 blocks per SM).
        int const lane = tid & (kWarpSize - 1);
        int const r = lane / TT;
        int const t = lane - r * TT;
        float sum = 0.0f;
        for (int s = 0; r < R && t < args.numTokens && s < args.topK; ++s)
        {
            int const e = args.expertIds[t * args.topK + s];
            sum = fmaf(args.routingWeights[t * args.topK + s],
                toFloat(args.expertDownBias[static_cast<size_t>(e) * d + min(firstRow + r, d - 1)]), sum);
        }
#pragma unroll
        for (int rr = 0; rr < R; ++rr)
        {
#pragma unroll
            for (int tt = 0; tt < TT; ++tt)
                acc[rr][tt] += lane == rr * TT + tt ? sum : 0.0f;
        }
    }
    storeRows<TT>(acc, firstRow, d, args.numTokens, [&args, d](int t, int row, float value) {
        size_t const at = static_cast<size_t>(t) * d + row;
        if (args.sharedOut)
            value += args.sharedOut[at];
        args.output[at] = fromFloat<T>(value);
    });
}

} // namespace detail
} // namespace deamoe
