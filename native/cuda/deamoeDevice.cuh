/*
 * Device math of the DeaMoE kernels (deamoeForward.cuh): dtype conversions, 16-byte
 * non-allocating loads, programmatic dependent launch, the warp GEMV row loop, flags.
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
// Kernel launch (see launchKernel in deamoeLaunch.cuh), an expression giving the launch's cudaError_t;
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

// E activation values starting at p in shared memory (16-byte aligned; staged by the
// staged-down variant in the activation dtype), as float.
template <class A, int E>
DEAMOE_DEVICE void loadStagedActivation(A const* p, float (&f)[E])
{
    static_assert(sizeof(A) * E % 16 == 0, "whole 16-byte vectors");
    constexpr int perVector = 16 / static_cast<int>(sizeof(A));
#pragma unroll
    for (int i = 0; i < E / perVector; ++i)
    {
        float part[perVector];
        unpack<A>(reinterpret_cast<uint4 const*>(p)[i], part);
#pragma unroll
        for (int e = 0; e < perVector; ++e)
            f[i * perVector + e] = part[e];
    }
}

// E activations at p: read through L1 (global memory), or from shared memory (SMEM).
template <bool SMEM, class A, int E>
DEAMOE_DEVICE void loadActivations(A const* p, float (&f)[E])
{
    if constexpr (SMEM)
        loadStagedActivation<A, E>(p, f);
    else
        loadActivation<A, E>(p, f);
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

// The FFN activation a(g, u) of every part (LayerParams::activation; deamoe_trt/activation.py),
// applied to the pre-activations after their biases.
struct GluParams
{
    int32_t clamped; // Activation::kSWIGLU_CLAMPED
    float alpha;     // swiglu_alpha
    float limit;     // swiglu_limit

    DEAMOE_DEVICE float operator()(float g, float u) const
    {
        if (!clamped)
            return silu(g) * u;
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
        return (u + 1.0f) * g * sigmoid(alpha * g);
    }
};

// An optional bias vector in the activation dtype: 0 when absent.
template <class T>
DEAMOE_DEVICE float biasAt(T const* bias, size_t i)
{
    return bias ? toFloat(bias[i]) : 0.0f;
}

// Chunks (16-byte units) each lane keeps in flight per row; fewer for wide tiles, whose
// per-token accumulators need the registers. With two rows per warp that is 8 (TT <= 4)
// or 4 (TT 8, 16) 16-byte loads in flight per lane.
template <int TT>
struct Unroll
{
    static constexpr int value = TT <= 4 ? 4 : 2;
};

// acc[r][t] += this lane's share of dot(rows[r][chunk range], act[offset[t] + ...]) for
// the tokens t whose bit is set in `tokens` (the same for the whole warp, so the token
// branches are uniform). No cross-lane reduction. The order of operations per (r, t)
// depends only on the lane and the chunk range: results are bitwise reproducible.
// SMEM: act is in shared memory (the staged-down variant), else global memory read through L1.
// U: chunks per row in flight (the deep-loads variant's gate/up rows: twice Unroll's).
template <class W, class A, int R, int TT, bool SMEM = false, int U = Unroll<TT>::value>
DEAMOE_DEVICE void accumulateRows(W const* const (&rows)[R], int chunkBegin, int chunkEnd, A const* act,
    int const (&offset)[TT], uint32_t tokens, float (&acc)[R][TT])
{
    constexpr int E = Elems16<W>::value;
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
                    if ((tokens >> t) & 1u)
                    {
                        float a[E];
                        // Shared memory: an offset may be negative (a staged window's first
                        // column subtracted), so the index is summed before the pointer moves.
                        loadActivations<SMEM, A, E>(
                            SMEM ? act + (offset[t] + c * E) : act + offset[t] + static_cast<size_t>(c) * E, a);
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
// Quantized FFN weights (LayerParams::weightBits 4 or 8, docs/quantization.md): unsigned
// codes with the implicit zero point 2^(bits-1), int4 two per byte (the even column in the
// low nibble), one scale per (row, group of 2^groupShift input columns), w = s * (q - zp).

template <int BITS>
struct QuantCodes
{
    static_assert(BITS == 4 || BITS == 8, "int4 or int8 codes");
    static constexpr int kPerChunk = 128 / BITS;                    // weights per 16-byte chunk: 32 or 16
    static constexpr int kSubs = kPerChunk / 8;                     // 8-weight pieces per chunk: 4 or 2
    static constexpr float kMagic = 8388608.0f + (1 << (BITS - 1)); // 2^23 + zero point
};

// One row of a quantized matrix: its codes and its scales.
template <class S>
struct QuantRow
{
    uint8_t const* codes; // cols * BITS / 8 bytes, 16-byte aligned
    S const* scales;      // cols >> groupShift
};

// Row `row` of a quantized matrix of `cols` input columns (codes and scales from row 0).
template <int BITS, class S>
DEAMOE_DEVICE QuantRow<S> quantRow(uint8_t const* codes, S const* scales, size_t row, int cols, int groupShift)
{
    return QuantRow<S>{
        codes + row * static_cast<size_t>(cols * BITS / 8), scales + row * static_cast<size_t>(cols >> groupShift)};
}

DEAMOE_DEVICE uint32_t word(uint4 v, int i)
{
    return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w)); // i is a constant after unrolling
}

// Weights 8*sub .. 8*sub+7 of a 16-byte chunk of codes as the exact floats q - zero point.
// 2^23 + q has q in its mantissa: OR the code into 2^23's bits and subtract 2^23 + zp, one
// exact float add per weight and no integer-to-float conversion (a quarter-rate instruction).
template <int BITS>
DEAMOE_DEVICE void dequantizeCodes(uint4 raw, int sub, float (&q)[8])
{
    constexpr float magic = QuantCodes<BITS>::kMagic;
    if constexpr (BITS == 4)
    {
        uint32_t const w = word(raw, sub); // 8 codes, column k in bits 4k..4k+3
#pragma unroll
        for (int k = 0; k < 8; ++k)
            q[k] = __uint_as_float(0x4B000000u | ((w >> (4 * k)) & 0xFu)) - magic;
    }
    else
    {
#pragma unroll
        for (int h = 0; h < 2; ++h)
        {
            uint32_t const w = word(raw, 2 * sub + h); // 4 codes, column k in byte k
#pragma unroll
            for (int k = 0; k < 4; ++k)
                q[4 * h + k] = __uint_as_float(0x4B000000u | ((w >> (8 * k)) & 0xFFu)) - magic;
        }
    }
}

// The bit-dequant variant's dequantizeCodes: the same exact floats q - zero point, with fewer
// integer instructions per weight (sm_90 ptxas: 68 against 112 per int4 chunk of 32 weights,
// 33 against 48 per int8 chunk of 16). A float whose exponent gives mantissa bit b the weight
// 1 holds 2^(23-b) + q when OR-ed with code q masked in place at bit b (b + 3 < 23): one LOP3
// per int4 weight, no shift, for the 5 nibbles below bit 20 and, after one shift by 12, the
// other 3; int8 codes are moved next to 2^23's exponent byte by one PRMT each. The float
// subtraction of 2^(23-b) + zp stays, exact as in dequantizeCodes.
template <uint32_t MASK, uint32_t BITS>
DEAMOE_DEVICE uint32_t maskOr(uint32_t a)
{
#if defined(__CUDA_ARCH__)
    // Both constants are immediates, one of which ptxas keeps in a register outside the loop:
    // one LOP3, where the C expression compiles to two (a 3-input LOP3 takes one immediate).
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(a), "n"(MASK), "n"(BITS)); // (a & b) | c
    return r;
#else
    return (a & MASK) | BITS; // the same bits: the lop3 LUT 0xea is (a & b) | c
#endif
}

// Code K (0..7) of a word of 8 int4 codes (hi: the word shifted right by 12) as q - 8.
template <int K>
DEAMOE_DEVICE float int4Code(uint32_t w, uint32_t hi)
{
    constexpr int bit = K < 5 ? 4 * K : 4 * K - 12;                            // its lowest bit in w or hi
    constexpr uint32_t exponent = static_cast<uint32_t>(127 + 23 - bit) << 23; // 2^(23-bit)
    constexpr float offset = static_cast<float>(1u << (23 - bit)) + 8.0f;      // 2^(23-bit) + zero point
    return __uint_as_float(maskOr<0xFu << bit, exponent>(K < 5 ? w : hi)) - offset;
}

template <int BITS>
DEAMOE_DEVICE void dequantizeCodesBitTricks(uint4 raw, int sub, float (&q)[8])
{
    if constexpr (BITS == 4)
    {
        uint32_t const w = word(raw, sub);
        uint32_t const hi = w >> 12;
        q[0] = int4Code<0>(w, hi);
        q[1] = int4Code<1>(w, hi);
        q[2] = int4Code<2>(w, hi);
        q[3] = int4Code<3>(w, hi);
        q[4] = int4Code<4>(w, hi);
        q[5] = int4Code<5>(w, hi);
        q[6] = int4Code<6>(w, hi);
        q[7] = int4Code<7>(w, hi);
    }
    else
    {
        constexpr float magic = QuantCodes<BITS>::kMagic;
#pragma unroll
        for (int h = 0; h < 2; ++h)
        {
            uint32_t const w = word(raw, 2 * sub + h);
            // Bytes of the result: code k, 0x00, 0x00, 0x4B (selector nibbles k, 4, 4, 7).
#pragma unroll
            for (int k = 0; k < 4; ++k)
                q[4 * h + k] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | static_cast<uint32_t>(k))) - magic;
        }
    }
}

// dequantizeCodes (BIT_DEQUANT false) or dequantizeCodesBitTricks: bitwise the same floats.
template <int BITS, bool BIT_DEQUANT>
DEAMOE_DEVICE void dequantize(uint4 raw, int sub, float (&q)[8])
{
    if constexpr (BIT_DEQUANT)
        dequantizeCodesBitTricks<BITS>(raw, sub, q);
    else
        dequantizeCodes<BITS>(raw, sub, q);
}

// Chunks per row each lane keeps in flight on quantized rows, gate/up and down alike: 2. A
// chunk of codes is 16 or 32 weights of work, so two already cover the latency once enough
// warps run; 4 on the gate/up rows (the float path's) held ~127 registers at 1 token, 4
// blocks per SM, and measured slower on an H200 (deepseek-v3-layer int4 at 1 token: 139 us
// against 126 us with 2 and 6 blocks per SM; docs/benchmarks.md, "CUDA kernels on an H200").
// The down rows have no more: deepseek-v3's 2048 int4 columns are 64 chunks, two per lane.
constexpr int kQuantUnroll = 2;

// Blocks per SM the gate/up kernels (K1, K2) ask ptxas for on quantized rows at 1 token: 6
// (<= 80 registers), which kQuantUnroll's two chunks fit without spilling; unasked they held
// ~127 registers, 4 blocks per SM.
constexpr int kQuantOneTokenMinBlocks = 6;
// The staged-gate-up variant's gate/up kernels there: 5 (<= 96 registers), as its window loop
// and staging took K1 to 80 with 8 bytes of spills at 6 (fp16, int4, bit-dequant, sm_90); its 14
// KiB of staged x per block (deepseek-v3-layer) leave room for 5 per SM anyway.
constexpr int kStagedQuantOneTokenMinBlocks = 5;

// How many of a chunk's 8-weight pieces the inner loop unrolls: all, except int4's four at
// 8 and 16 tokens, one at a time (fully unrolled, ptxas hoists every piece's codes and
// activations next to the per-token accumulators and spills: sm_110, float32). int8's two
// pieces stay unrolled (one at a time spills K1 at 16 tokens, bf16 sm_90).
template <int BITS, int TT>
struct QuantSubUnroll
{
    static constexpr int value = BITS == 4 && TT >= 8 ? 1 : QuantCodes<BITS>::kSubs;
};

// The quantized twin of accumulateRows: chunks [chunkBegin, chunkEnd) of 16 bytes of codes
// (32 int4 or 16 int8 weights each), the same lane/chunk assignment and token loop, U chunks
// per row in flight (kQuantUnroll). Every 8 weights give a float32 partial
// p = sum a * (q - zp), exact codes times activations, then acc += s * p: the scale is applied once per 8 weights (1 FMA per 8), the
// activations and codes are never rescaled, and no zero point is folded into a sum of
// activations (s * (sum a q - zp sum a) cancels catastrophically for int8's zp = 128). Its
// registers are the float path's: 8 dequantized codes per row, 8 activations, one partial.
// int4 at group size 16 has two groups per chunk (two scales), otherwise one. The order of
// operations per (r, t) depends only on the lane and the chunk range: bitwise reproducible.
// BIT_DEQUANT: the codes through dequantizeCodesBitTricks (the bit-dequant variant; the same floats).
template <int BITS, int U, class S, class A, int R, int TT, bool SMEM = false, bool BIT_DEQUANT = false>
DEAMOE_DEVICE void accumulateQuantRows(QuantRow<S> const (&rows)[R], int groupShift, int chunkBegin, int chunkEnd,
    A const* act, int const (&offset)[TT], uint32_t tokens, float (&acc)[R][TT])
{
    using Q = QuantCodes<BITS>;
    constexpr int H = BITS == 4 ? 2 : 1; // scales a chunk may need (int8: 16 columns, one group)
    int const lane = static_cast<int>(threadIdx.x) & (kWarpSize - 1);
    bool const twoGroups = H == 2 && groupShift < 5; // int4, group size 16: 32 columns, 2 groups
    for (int c0 = chunkBegin + lane; c0 < chunkEnd; c0 += kWarpSize * U)
    {
        uint4 raw[U][R];
        float scale[U][R][H];
#pragma unroll
        for (int u = 0; u < U; ++u)
        {
            int const c = c0 + u * kWarpSize;
            int const column = c * Q::kPerChunk;
#pragma unroll
            for (int r = 0; r < R; ++r)
            {
                raw[u][r] = c < chunkEnd ? loadStreaming(rows[r].codes + static_cast<size_t>(c) * 16)
                                         : make_uint4(0, 0, 0, 0);
                scale[u][r][0] = c < chunkEnd ? toFloat(rows[r].scales[column >> groupShift]) : 0.0f;
                if constexpr (H == 2)
                    scale[u][r][1] = c < chunkEnd && twoGroups ? toFloat(rows[r].scales[(column + 16) >> groupShift])
                                                               : scale[u][r][0];
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
        {
            int const c = c0 + u * kWarpSize;
            if (c < chunkEnd)
            {
                // Wide tiles: one 8-weight piece at a time (not unrolled), or ptxas hoists
                // every piece's codes and activations and spills (sm_110, float32, int4).
#pragma unroll(QuantSubUnroll<BITS, TT>::value)
                for (int sub = 0; sub < Q::kSubs; ++sub)
                {
                    float q[R][8];
#pragma unroll
                    for (int r = 0; r < R; ++r)
                        dequantize<BITS, BIT_DEQUANT>(raw[u][r], sub, q[r]);
#pragma unroll
                    for (int t = 0; t < TT; ++t)
                    {
                        if ((tokens >> t) & 1u)
                        {
                            float a[8];
                            loadActivations<SMEM, A, 8>(SMEM
                                    ? act + (offset[t] + c * Q::kPerChunk + 8 * sub)
                                    : act + offset[t] + static_cast<size_t>(c) * Q::kPerChunk + 8 * sub,
                                a);
#pragma unroll
                            for (int r = 0; r < R; ++r)
                            {
                                float p = q[r][0] * a[0];
#pragma unroll
                                for (int e = 1; e < 8; ++e)
                                    p = fmaf(q[r][e], a[e], p);
                                // (a select, not scale[..][sub * H / kSubs]: sub may be a
                                // loop variable, and a variable index puts the array in memory)
                                float const s = sub >= Q::kSubs / 2 ? scale[u][r][H - 1] : scale[u][r][0];
                                acc[r][t] = fmaf(s, p, acc[r][t]);
                            }
                        }
                    }
                }
            }
        }
    }
}

// accumulateQuantRows for rows of at most 16 chunks (deepseek-v3-layer's 512-wide int4
// down rows, 256-wide int8) with whole warps: lanes 0-15 take row 0 and lanes 16-31 row 1,
// one chunk each, where accumulateQuantRows leaves half of the warp idle. act is in shared
// memory (SMEM) or global memory. Each (row, token) is still one lane's fixed sequence of
// operations per chunk: bitwise reproducible.
template <int BITS, class S, class A, int R, int TT, bool SMEM, bool BIT_DEQUANT = false>
DEAMOE_DEVICE void accumulateQuantRowsNarrow(QuantRow<S> const (&rows)[R], int groupShift, int chunks, A const* act,
    int const (&offset)[TT], uint32_t tokens, float (&acc)[R][TT])
{
    static_assert(R == 2, "a half warp per row");
    using Q = QuantCodes<BITS>;
    int const lane = static_cast<int>(threadIdx.x) & (kWarpSize - 1);
    int const mine = lane >> 4; // this lane's row
    int const c = lane & (kWarpSize / 2 - 1);
    if (c >= chunks)
        return;
    QuantRow<S> const row = mine ? rows[1] : rows[0];
    uint4 const raw = loadStreaming(row.codes + static_cast<size_t>(c) * 16);
    int const column = c * Q::kPerChunk;
    float const scaleLow = toFloat(row.scales[column >> groupShift]);
    // int4 at group size 16: the chunk's upper 16 columns have their own scale.
    float const scaleHigh = BITS == 4 && groupShift < 5 ? toFloat(row.scales[(column + 16) >> groupShift]) : scaleLow;
#pragma unroll(QuantSubUnroll<BITS, TT>::value)
    for (int sub = 0; sub < Q::kSubs; ++sub)
    {
        float q[8];
        dequantize<BITS, BIT_DEQUANT>(raw, sub, q);
        float const s = sub >= Q::kSubs / 2 ? scaleHigh : scaleLow;
#pragma unroll
        for (int t = 0; t < TT; ++t)
        {
            if ((tokens >> t) & 1u)
            {
                float a[8];
                loadActivations<SMEM, A, 8>(act + offset[t] + column + 8 * sub, a);
                float p = q[0] * a[0];
#pragma unroll
                for (int e = 1; e < 8; ++e)
                    p = fmaf(q[e], a[e], p);
                acc[0][t] = mine ? acc[0][t] : fmaf(s, p, acc[0][t]);
                acc[1][t] = mine ? fmaf(s, p, acc[1][t]) : acc[1][t];
            }
        }
    }
}

// Bits 0..n-1.
DEAMOE_DEVICE uint32_t firstTokens(int n)
{
    return n >= 32 ? 0xffffffffu : (1u << n) - 1u;
}

// Acquire load of a flag another block of the same grid releases (plan ready).
DEAMOE_DEVICE int loadAcquire(int32_t const* address)
{
#if defined(__CUDA_ARCH__)
    int32_t value;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
    return value;
#elif defined(DEAMOE_SIMT_EMULATION)
    return __atomic_load_n(address, __ATOMIC_ACQUIRE);
#else
    return *address; // the host pass of nvcc: never called
#endif
}

} // namespace detail
} // namespace deamoe
