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
template <class W, class A, int R, int TT>
DEAMOE_DEVICE void accumulateRows(W const* const (&rows)[R], int chunkBegin, int chunkEnd, A const* act,
    int const (&offset)[TT], uint32_t tokens, float (&acc)[R][TT])
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
                    if ((tokens >> t) & 1u)
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
