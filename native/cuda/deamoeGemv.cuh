/*
 * The GEMV blocks the DeaMoE kernels share (deamoeForward.cuh): gate/up blocks of K1
 * (and the router logits) and of K2, and the warp down rows of K2 and K3.
 */
#pragma once

#include "deamoeDevice.cuh"

namespace deamoe
{
namespace detail
{

// ---------------------------------------------------------------------------------------
// Gate/up GEMV blocks of K1 (and the router logits, which are the same kind of x-only
// GEMV) and of K2 (the plan's parts)

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
    int32_t routedMode;     // 0: K1 (router + shared experts), 1: K2 (plan parts)
    // K1
    T const* routerWeight;  // [N][d]
    int32_t routerRows;     // N (+1 when sharedGateRow)
    int32_t numExperts;     // N
    T const* sharedGateRow; // [d] or nullptr: routed as logit column N
    float* logits;          // [tile][logitsStride]
    int32_t logitsStride;
    int32_t routerBlocks;
    float const* routerLogitBias; // [N] float32 or nullptr: added to logit columns < N
    T const* sharedGateUp;        // [2 f_sh][d] or nullptr
    int32_t sharedWidth;          // f_sh
    float* hShared;               // [tile][f_sh]
    int32_t* counters;            // [kNumCounters] zeroed for K2, or nullptr (route())
    // K2
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
    // Quantized FFN weights (gateUpBlock's BITS > 0): the shared experts', departments' and
    // experts' gate/up matrices are these codes and scales instead of the T matrices above
    // (which are then nullptr); the router rows stay T. Rows of codes are split into
    // codeChunksPerSlice chunks per slice (the slices are the launch's, chunksPerSlice is
    // the router rows').
    int32_t groupShift; // log2(weightGroupSize)
    int32_t codeChunksPerSlice;
    uint8_t const* sharedGateUpCodes;
    T const* sharedGateUpScales; // [2 f_sh][d / G]
    uint8_t const* departmentGateUpCodes;
    T const* departmentGateUpScales; // [D][2 f_s][d / G]
    uint8_t const* expertGateUpCodes;
    T const* expertGateUpScales; // [N][2 f_p][d / G]
    // Both modes: the activation, and the parts' gate/up biases (nullptr: none), added to
    // the pre-activations in the epilogue (never quantized).
    GluParams glu;
    T const* sharedGateUpBias;     // [2 f_sh]
    T const* departmentGateUpBias; // [D][2 f_s]
    T const* expertGateUpBias;     // [N][2 f_p]
    // The staged-gate-up variant (gateUpBlock's STAGED): columns of x staged per window
    // (stagedGateUpColumns; the block's dynamic shared memory holds TT rows of them).
    int32_t stageColumns;
};

// The gate and up rows (or the router row pair) of unit `unit` of a block's part, T weights.
template <class T>
DEAMOE_DEVICE void gateUpFloatRows(
    GateUpArgs<T> const& args, int kind, int unit, int width, T const* base, T const* (&rows)[2])
{
    int const d = args.hidden;
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
}

// The staged-gate-up variant's activations: columns [col0, col0 + columns) of the block's
// tokens' rows of x (token t's at x + tokenOf(t) * d) copied into staged[t * stride + j], in T:
// exact, whatever T. 16-byte vectors, spread over the block's threads. Called by every thread.
template <class T, class Row>
DEAMOE_DEVICE void stageActivations(
    T const* x, int d, Row const& tokenOf, int numTokens, int col0, int columns, int stride, T* staged)
{
    constexpr int V = Elems16<T>::value;
    int const vectors = columns / V;
    for (int i = static_cast<int>(threadIdx.x); i < numTokens * vectors; i += kGemvThreads)
    {
        int const t = i / vectors;
        int const j = (i - t * vectors) * V;
        *reinterpret_cast<uint4*>(staged + t * stride + j)
            = __ldg(reinterpret_cast<uint4 const*>(x + static_cast<size_t>(tokenOf(t)) * d + col0 + j));
    }
}

// The staged-gate-up variant's dot products of a gate/up block: the block stages its tokens'
// x window by window (args.stageColumns columns; the last may be shorter) in shared memory, and
// each warp accumulates its whole rows (the launch sets slices = 1: 4 units, 8 rows, per block)
// from there: x is read from L1/L2 once per block, not once per warp. Each lane takes the
// default's chunks in the default's order (a window is a multiple of 32 chunks, or the whole
// row), so with slices = 1 the sums are bitwise the default's. Called by every thread (barriers).
template <class T, int TT, int BITS, int U, bool BIT_DEQUANT, class Row>
DEAMOE_DEVICE void stagedGateUpRows(GateUpArgs<T> const& args, bool quantRows, T const* const (&rows)[2],
    QuantRow<T> const (&codeRows)[2], Row const& tokenOf, int numTokens, bool active, float (&acc)[2][TT])
{
    constexpr int E = Elems16<T>::value;
    T* const staged = reinterpret_cast<T*>(dynamicSmem());
    int const d = args.hidden;
    int const cols = args.stageColumns;
    int const perChunk = quantRows ? 128 / (BITS > 0 ? BITS : 8) : E; // columns per 16-byte chunk of the rows
    int const chunksPerRow = d / perChunk;
    int const windowChunks = cols / perChunk;
    uint32_t const tokens = firstTokens(numTokens);
    for (int w0 = 0; w0 < chunksPerRow; w0 += windowChunks)
    {
        int const w1 = min(w0 + windowChunks, chunksPerRow);
        int const col0 = w0 * perChunk;
        __syncthreads(); // the previous window is consumed
        stageActivations(args.x, d, tokenOf, numTokens, col0, (w1 - w0) * perChunk, cols, staged);
        __syncthreads();
        if (!active)
            continue;
        int offset[TT];
#pragma unroll
        for (int t = 0; t < TT; ++t)
            offset[t] = t * cols - col0;
        if constexpr (BITS > 0)
        {
            if (quantRows)
            {
                accumulateQuantRows<BITS, kQuantUnroll, T, T, 2, TT, true, BIT_DEQUANT>(
                    codeRows, args.groupShift, w0, w1, staged, offset, tokens, acc);
                continue;
            }
        }
        accumulateRows<T, T, 2, TT, true, U>(rows, w0, w1, staged, offset, tokens, acc);
    }
}

// One gate/up block: block index `block` of the K1 or K2 gate/up grid. BITS: 0 for T
// weights, 4 or 8 for quantized FFN weights (the router rows are T either way). U: chunks
// per T row in flight (the deep-loads variant: twice Unroll's). BIT_DEQUANT: the bit-dequant
// variant's code conversion (dequantizeCodesBitTricks).
// STAGED: the staged-gate-up variant (stagedGateUpRows).
template <class T, int TT, int BITS = 0, int U = Unroll<TT>::value, bool BIT_DEQUANT = false, bool STAGED = false>
DEAMOE_DEVICE void gateUpBlock(GateUpArgs<T> const& args, int block)
{
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
    int biasGroup = -1;      // the part's row of gate/up biases (its id; 0: the shared experts), -1: none
    QuantRow<T> quantBase{}; // BITS > 0: row 0 of the part's gate/up codes and scales
    PlanEntry const* entries = nullptr;
    int numTokens = args.numTokens;
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
            biasGroup = args.sharedGateUpBias ? 0 : -1;
            quantBase = QuantRow<T>{args.sharedGateUpCodes, args.sharedGateUpScales};
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
            biasGroup = args.departmentGateUpBias ? args.plan.departments[part] : -1;
            if constexpr (BITS > 0)
                quantBase = quantRow<BITS>(args.departmentGateUpCodes, args.departmentGateUpScales,
                    static_cast<size_t>(args.plan.departments[part]) * 2 * width, d, args.groupShift);
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
            biasGroup = args.expertGateUpBias ? args.plan.experts[part] : -1;
            if constexpr (BITS > 0)
                quantBase = quantRow<BITS>(args.expertGateUpCodes, args.expertGateUpScales,
                    static_cast<size_t>(args.plan.experts[part]) * 2 * width, d, args.groupShift);
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

    float acc[2][TT];
#pragma unroll
    for (int r = 0; r < 2; ++r)
    {
#pragma unroll
        for (int t = 0; t < TT; ++t)
            acc[r][t] = 0.0f;
    }

    if constexpr (STAGED)
    {
        bool const quant = BITS > 0 && kind != kKindRouter;
        T const* rows[2] = {nullptr, nullptr};
        QuantRow<T> quantRows[2] = {};
        if (active && quant)
        {
            if constexpr (BITS > 0)
            {
                quantRows[0] = quantRow<BITS>(quantBase.codes, quantBase.scales, unit, d, args.groupShift);
                quantRows[1] = quantRow<BITS>(quantBase.codes, quantBase.scales, width + unit, d, args.groupShift);
            }
        }
        else if (active)
            gateUpFloatRows(args, kind, unit, width, base, rows);
        auto const tokenOf = [entries](int t) { return entries ? entries[t].token : t; };
        stagedGateUpRows<T, TT, BITS, U, BIT_DEQUANT>(args, quant, rows, quantRows, tokenOf, numTokens, active, acc);
    }
    else
    {
        int offset[TT];
#pragma unroll
        for (int t = 0; t < TT; ++t)
        {
            int const token = entries ? (t < numTokens ? entries[t].token : 0) : t;
            offset[t] = token * d;
        }

        if (active && BITS > 0 && kind != kKindRouter)
        {
            if constexpr (BITS > 0)
            {
                QuantRow<T> const rows[2]
                    = {quantRow<BITS>(quantBase.codes, quantBase.scales, unit, d, args.groupShift),
                        quantRow<BITS>(quantBase.codes, quantBase.scales, width + unit, d, args.groupShift)};
                int const chunksPerRow = d * BITS / 128;
                int const begin = slice * args.codeChunksPerSlice;
                int const end = min(begin + args.codeChunksPerSlice, chunksPerRow);
                accumulateQuantRows<BITS, kQuantUnroll, T, T, 2, TT, false, BIT_DEQUANT>(
                    rows, args.groupShift, begin, end, args.x, offset, firstTokens(numTokens), acc);
            }
        }
        else if (active)
        {
            T const* rows[2];
            gateUpFloatRows(args, kind, unit, width, base, rows);
            int const chunksPerRow = d / E;
            int const begin = slice * args.chunksPerSlice;
            int const end = min(begin + args.chunksPerSlice, chunksPerRow);
            accumulateRows<T, T, 2, TT, false, U>(rows, begin, end, args.x, offset, firstTokens(numTokens), acc);
        }
    }
    if (active)
    {
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
    // The gate/up biases, on the finished dot products as in the reference (none for the
    // router rows, whose logit bias follows). Resolved here, not kept across the rows.
    if (biasGroup >= 0)
    {
        T const* bias = kind == kKindShared
            ? args.sharedGateUpBias
            : (kind == kKindDepartment ? args.departmentGateUpBias : args.expertGateUpBias);
        bias += static_cast<size_t>(biasGroup) * 2 * width;
        g += toFloat(bias[neuron]);
        u += toFloat(bias[width + neuron]);
    }
    switch (kind)
    {
    case kKindRouter:
    {
        // z = x Wr^T + b_z on the experts' columns; the shared-expert gate's (N) has no bias.
        int const row0 = 2 * neuron;
        if (args.routerLogitBias && row0 < args.numExperts)
            g += args.routerLogitBias[row0];
        if (args.routerLogitBias && row0 + 1 < args.numExperts)
            u += args.routerLogitBias[row0 + 1];
        args.logits[t * args.logitsStride + row0] = g;
        if (row0 + 1 < args.routerRows)
            args.logits[t * args.logitsStride + row0 + 1] = u;
        break;
    }
    case kKindShared: args.hShared[t * args.sharedWidth + neuron] = args.glu(g, u); break;
    case kKindDepartment:
    {
        PlanEntry const entry = entries[t];
        args.hDepartment[(entry.token * args.departmentSlots + entry.slot) * width + neuron]
            = entry.weight * args.glu(g, u);
        break;
    }
    default:
    {
        PlanEntry const entry = entries[t];
        args.hExpert[(entry.token * args.topK + entry.slot) * width + neuron] = entry.weight * args.glu(g, u);
        break;
    }
    }
}

// ---------------------------------------------------------------------------------------
// Down rows: a warp's kDownRowsPerWarp rows (firstRow, firstRow + 1, ...) of a down
// projection [d][f], accumulated per token, then reduced across the warp.

template <class T>
DEAMOE_DEVICE void downRowPointers(
    T const* down, int width, int hidden, int firstRow, T const* (&rows)[kDownRowsPerWarp])
{
#pragma unroll
    for (int r = 0; r < kDownRowsPerWarp; ++r)
        rows[r] = down + static_cast<size_t>(min(firstRow + r, hidden - 1)) * width;
}

// The quantized twin: rows of codes and scales of a down projection [d][width].
template <int BITS, class S>
DEAMOE_DEVICE void downQuantRows(uint8_t const* codes, S const* scales, int width, int hidden, int groupShift,
    int firstRow, QuantRow<S> (&rows)[kDownRowsPerWarp])
{
#pragma unroll
    for (int r = 0; r < kDownRowsPerWarp; ++r)
        rows[r] = quantRow<BITS>(codes, scales, static_cast<size_t>(min(firstRow + r, hidden - 1)), width, groupShift);
}

// Reduces acc over the warp (fixed butterfly) and hands each (token t < numTokens, row)
// value to store(t, row, value), called by one lane per value.
template <int TT, class Store>
DEAMOE_DEVICE void storeRows(
    float (&acc)[kDownRowsPerWarp][TT], int firstRow, int hidden, int numTokens, Store const& store)
{
    constexpr int R = kDownRowsPerWarp;
    static_assert(R * TT <= kWarpSize, "one lane per stored value");
    int const lane = static_cast<int>(threadIdx.x) & (kWarpSize - 1);
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

} // namespace detail
} // namespace deamoe
