/*
 * A small SIMT emulator: runs the DeaMoE CUDA kernels (native/cuda/deamoeForward.cuh)
 * on the CPU, one host thread per CUDA thread, so the CPU-only CI can execute the real
 * kernel code end to end (launch geometry, plan consumption, warp reductions, the fused
 * down reduction) and compare it with the PyTorch reference.
 *
 * What it models: threadIdx/blockIdx/blockDim/gridDim, __syncthreads, __syncwarp, warp
 * shuffles and ballots (lockstep through a per-warp barrier), shared memory (blocks run one
 * at a time, so `static` storage is the block's shared memory; dynamic shared memory is
 * poisoned with 0xff bytes at every block start), integer atomics and fences.
 * What it does not model: timing, memory coalescing, the L1 non-coherence the kernels
 * guard against, or concurrently running blocks. A warp collective called while some
 * lanes of the warp have exited aborts (it is undefined on the GPU as well).
 *
 * Used by the kernel tests and `deamoe-trt check-gpu --dry-run` (deamoe_trt/checks/emulated.py
 * builds it). Build: g++ -std=c++20 -pthread -I<cuda>/include -I<kernel sources>/deamoe ...
 */
#pragma once

#define DEAMOE_SIMT_EMULATION 1
#define __shared__ static
#define __launch_bounds__(...)

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <vector_types.h>

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

namespace simt
{

constexpr int kWarp = 32;

struct Warp
{
    explicit Warp(int lanes)
        : barrier(lanes)
        , alive(lanes)
    {
    }
    std::barrier<> barrier;
    std::atomic<int> alive;
    uint64_t slots[kWarp] = {};
};

struct Block
{
    Block(int threads, size_t smemBytes)
        : barrier(threads)
        , smem(smemBytes / 16 + 1)
    {
        std::memset(smem.data(), 0xff, smem.size() * sizeof(float4)); // poison: NaN floats, -1 ints
        for (int w = 0; w < threads / kWarp; ++w)
            warps.push_back(std::make_unique<Warp>(kWarp));
    }
    std::barrier<> barrier;
    std::vector<std::unique_ptr<Warp>> warps;
    std::vector<float4> smem;
};

inline Block* currentBlock = nullptr; // one block runs at a time

[[noreturn]] inline void die(char const* what)
{
    std::fprintf(stderr, "simt emulator: %s (block %u thread %u)\n", what, blockIdx.x, threadIdx.x);
    std::abort();
}

inline Warp& myWarp()
{
    Warp& w = *currentBlock->warps[threadIdx.x / kWarp];
    if (w.alive.load() != kWarp)
        die("warp collective with exited lanes");
    return w;
}

template <class T>
T exchange(T value, int (*partner)(int, int), int arg)
{
    static_assert(sizeof(T) <= sizeof(uint64_t));
    Warp& w = myWarp();
    int const lane = static_cast<int>(threadIdx.x) % kWarp;
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof(T));
    w.slots[lane] = bits;
    w.barrier.arrive_and_wait();
    uint64_t const other = w.slots[partner(lane, arg)];
    w.barrier.arrive_and_wait();
    T result;
    std::memcpy(&result, &other, sizeof(T));
    return result;
}

// Runs body() for every thread of every block. Threads live for the whole launch; blocks
// run one after another.
template <class Body>
void launch(unsigned grid, unsigned threads, size_t smemBytes, Body const& body)
{
    if (threads == 0 || threads % kWarp != 0 || threads > 1024)
        die("block size must be a positive multiple of 32, at most 1024");
    if (smemBytes > 48 * 1024)
        die("dynamic shared memory above 48 KiB needs an opt-in the kernels do not make");
    std::barrier<> start(threads + 1);
    std::barrier<> done(threads + 1);
    unsigned currentBlockIndex = 0;
    bool stop = false;
    std::vector<std::thread> workers;
    workers.reserve(threads);
    for (unsigned t = 0; t < threads; ++t)
    {
        workers.emplace_back([&, t] {
            for (;;)
            {
                start.arrive_and_wait();
                if (stop)
                    return;
                threadIdx = uint3{t, 0, 0};
                blockIdx = uint3{currentBlockIndex, 0, 0};
                blockDim = dim3(threads, 1, 1);
                gridDim = dim3(grid, 1, 1);
                body();
                // Exited threads stop counting for later barriers, as on the GPU.
                Block* b = currentBlock;
                b->warps[t / kWarp]->alive.fetch_sub(1);
                b->warps[t / kWarp]->barrier.arrive_and_drop();
                b->barrier.arrive_and_drop();
                done.arrive_and_wait();
            }
        });
    }
    for (unsigned b = 0; b < grid; ++b)
    {
        Block block(static_cast<int>(threads), smemBytes);
        currentBlock = &block;
        currentBlockIndex = b;
        start.arrive_and_wait();
        done.arrive_and_wait();
        currentBlock = nullptr;
    }
    stop = true;
    start.arrive_and_wait();
    for (auto& w : workers)
        w.join();
}

// The CUDA runtime's per-thread last-error state, as far as launches touch it: a failed
// launch records its error (cudaGetLastError returns and clears it, cudaPeekAtLastError
// only returns it; emulated_kernels.cpp), and tests can make launches fail.
inline cudaError_t lastError = cudaSuccess;
inline int launchesToFail = 0;
inline cudaError_t launchFailure = cudaErrorLaunchOutOfResources;

// launch() with cudaLaunchKernelEx's result: an empty grid is an invalid configuration, as
// on the GPU, and the next launchesToFail launches fail with launchFailure without running.
template <class Body>
cudaError_t launchChecked(unsigned grid, unsigned threads, size_t smemBytes, Body const& body)
{
    cudaError_t error = cudaSuccess;
    if (grid == 0)
        error = cudaErrorInvalidConfiguration;
    else if (launchesToFail > 0)
    {
        --launchesToFail;
        error = launchFailure;
    }
    if (error != cudaSuccess)
    {
        lastError = error;
        return error;
    }
    launch(grid, threads, smemBytes, body);
    return cudaSuccess;
}

} // namespace simt

// An expression, as the CUDA one: the launch's cudaError_t.
#define DEAMOE_LAUNCH(kernel, grid, block, smem, stream, args)                                                         \
    ((void) (stream),                                                                                                  \
        ::simt::launchChecked(static_cast<unsigned>(grid), static_cast<unsigned>(block), static_cast<size_t>(smem),    \
            [&] { kernel(args); }))

// ---- CUDA device functions the kernels use ----

inline void __syncthreads()
{
    simt::currentBlock->barrier.arrive_and_wait();
}

inline void __syncwarp(unsigned = 0xffffffffu)
{
    simt::myWarp().barrier.arrive_and_wait();
}

inline void __threadfence()
{
    std::atomic_thread_fence(std::memory_order_seq_cst);
}

template <class T>
T __shfl_xor_sync(unsigned, T value, int laneMask)
{
    return simt::exchange(value, [](int lane, int mask) { return lane ^ mask; }, laneMask);
}

inline unsigned __ballot_sync(unsigned, int predicate)
{
    simt::Warp& w = simt::myWarp();
    int const lane = static_cast<int>(threadIdx.x) % simt::kWarp;
    w.slots[lane] = predicate ? 1u : 0u;
    w.barrier.arrive_and_wait();
    unsigned votes = 0;
    for (int i = 0; i < simt::kWarp; ++i)
        votes |= static_cast<unsigned>(w.slots[i]) << i;
    w.barrier.arrive_and_wait();
    return votes;
}

inline int atomicAdd(int* address, int value)
{
    return __atomic_fetch_add(address, value, __ATOMIC_SEQ_CST);
}

inline int atomicExch(int* address, int value)
{
    return __atomic_exchange_n(address, value, __ATOMIC_SEQ_CST);
}

// Blocks run one at a time here, so a spin wait on another block's flag can only succeed
// if that block ran earlier: one that spins this long never will (a kernel bug), abort.
inline void __nanosleep(unsigned)
{
    thread_local long spins = 0;
    if (++spins > 10'000'000)
        simt::die("spin wait never satisfied (the flag's writer must run first)");
    std::this_thread::yield();
}

inline unsigned atomicOr(unsigned* address, unsigned value)
{
    return __atomic_fetch_or(address, value, __ATOMIC_SEQ_CST);
}

template <class T>
T __ldg(T const* p)
{
    return *p;
}

template <class T>
T __ldcg(T const* p)
{
    return *p;
}

inline float __uint_as_float(unsigned v)
{
    float f;
    std::memcpy(&f, &v, sizeof(f));
    return f;
}

// prmt.b32's default mode: byte n of the result is byte (s >> 4n) & 7 of the 8 bytes y:x.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s)
{
    uint64_t const bytes = (static_cast<uint64_t>(y) << 32) | x;
    unsigned r = 0;
    for (int n = 0; n < 4; ++n)
        r |= static_cast<unsigned>((bytes >> (8 * ((s >> (4 * n)) & 7u))) & 0xffu) << (8 * n);
    return r;
}
using std::max;
using std::min;

namespace deamoe
{
namespace detail
{
inline float* dynamicSmem()
{
    return reinterpret_cast<float*>(simt::currentBlock->smem.data());
}
} // namespace detail
} // namespace deamoe
