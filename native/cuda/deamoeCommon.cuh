/*
 * Pieces shared by the DeaMoE routing/plan logic and the kernels.
 *
 * The routing and plan code (deamoeRouting.cuh, deamoePlan.cuh) is written once against a
 * small "lanes" interface: on the GPU the lanes are the 32 threads of a warp (or the
 * threads of a block), on the host a single serial lane. The same source therefore
 * compiles with nvcc for the device and with a plain C++17 compiler for the host tests
 * (tests/native/cuda/), which is how the tests can check the device's decision logic against
 * deamoe_trt/routing.py without a GPU.
 *
 * Nothing here may include CUDA headers outside `#if defined(__CUDACC__)`.
 * Never build this code with fast-math: the routing relies on NaN marking and exact
 * IEEE comparisons (see deamoeRouting.cuh).
 */
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define DEAMOE_HD __host__ __device__ __forceinline__
#define DEAMOE_DEVICE __device__ __forceinline__
#else
#define DEAMOE_HD inline
#define DEAMOE_DEVICE inline
#endif

// DEAMOE_SIMT_EMULATION: the kernels compiled by a host compiler against
// deamoe_trt/cuda/simt_emulator/simt_emulator.h, which runs every CUDA thread as a host thread.
// It lets the CPU-only CI (and `check-gpu --dry-run`) execute the real kernel code.
#if defined(__CUDACC__) || defined(DEAMOE_SIMT_EMULATION)
#define DEAMOE_HAS_DEVICE_CODE 1
#else
#define DEAMOE_HAS_DEVICE_CODE 0
#endif

namespace deamoe
{
namespace detail
{

constexpr int kWarpSize = 32;

// Tokens per forward "step tile". forward() processes the batch in tiles of this many
// tokens; within one tile every used weight row is read once. Token sets are uint32 bit
// masks and the kernels keep one accumulator per token in registers, hence the bound.
constexpr int kMaxTileTokens = 16;

DEAMOE_HD int popcount32(uint32_t v)
{
#if defined(__CUDA_ARCH__)
    return __popc(v);
#else
    return __builtin_popcount(v);
#endif
}

// Index of the lowest set bit of v (v != 0).
DEAMOE_HD int lowestBit(uint32_t v)
{
#if defined(__CUDA_ARCH__)
    return __ffs(static_cast<int>(v)) - 1;
#else
    return __builtin_ctz(v);
#endif
}

// "a beats b" for selection: larger value wins, equal values go to the lower index.
// A NaN never wins (comparisons with NaN are false): the selection loops mark taken
// entries with NaN.
DEAMOE_HD bool beats(float va, int ia, float vb, int ib)
{
    return va > vb || (va == vb && ia < ib);
}

// v is neither NaN nor infinite: v - v is 0 exactly for finite v, NaN otherwise (IEEE; the
// same expression on host and device, with no <cmath> overload to pick).
DEAMOE_HD bool isFiniteFloat(float v)
{
    return v - v == 0.0f;
}

// One serial lane: the host build, or a single device thread.
struct SerialLanes
{
    DEAMOE_HD int lane() const { return 0; }
    DEAMOE_HD int width() const { return 1; }
    DEAMOE_HD bool leader() const { return true; }
    DEAMOE_HD void sync() const {}
    DEAMOE_HD float reduceMax(float v) const { return v; }
    DEAMOE_HD float reduceSum(float v) const { return v; }
    DEAMOE_HD void reduceArgmax(float&, int&) const {}
    DEAMOE_HD uint32_t ballot(bool p) const { return p ? 1u : 0u; }
    DEAMOE_HD uint32_t lowerLanesMask() const { return 0u; }
    DEAMOE_HD void atomicOrU32(uint32_t* address, uint32_t bits) const { *address |= bits; }
};

#if DEAMOE_HAS_DEVICE_CODE

// The 32 lanes of one warp, all active.
struct WarpLanes
{
    __device__ int lane() const { return static_cast<int>(threadIdx.x) & (kWarpSize - 1); }
    __device__ int width() const { return kWarpSize; }
    __device__ bool leader() const { return lane() == 0; }
    __device__ void sync() const { __syncwarp(); }
    __device__ float reduceMax(float v) const
    {
#pragma unroll
        for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
            v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
        return v;
    }
    __device__ float reduceSum(float v) const
    {
#pragma unroll
        for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
            v += __shfl_xor_sync(0xffffffffu, v, offset);
        return v;
    }
    // Butterfly: every lane ends with the same (value, index), whatever the lane order.
    __device__ void reduceArgmax(float& v, int& i) const
    {
#pragma unroll
        for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
        {
            float ov = __shfl_xor_sync(0xffffffffu, v, offset);
            int oi = __shfl_xor_sync(0xffffffffu, i, offset);
            if (beats(ov, oi, v, i))
            {
                v = ov;
                i = oi;
            }
        }
    }
    __device__ uint32_t ballot(bool p) const { return __ballot_sync(0xffffffffu, p); }
    __device__ uint32_t lowerLanesMask() const { return (1u << lane()) - 1u; }
    __device__ void atomicOrU32(uint32_t* address, uint32_t bits) const { atomicOr(address, bits); }
};

// All threads of a block (barrier: __syncthreads). Every thread must call sync().
struct BlockLanes
{
    __device__ int lane() const { return static_cast<int>(threadIdx.x); }
    __device__ int width() const { return static_cast<int>(blockDim.x); }
    __device__ bool leader() const { return threadIdx.x == 0; }
    __device__ void sync() const { __syncthreads(); }
    __device__ void atomicOrU32(uint32_t* address, uint32_t bits) const { atomicOr(address, bits); }
};

#endif // DEAMOE_HAS_DEVICE_CODE

} // namespace detail
} // namespace deamoe
