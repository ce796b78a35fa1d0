/*
 * The kernel library (native/cuda/deamoeKernels.cu and the three dtype instantiations)
 * built for the CPU under the SIMT emulator: libdeamoe_emulated.so exports the same C ABI
 * as libdeamoe_kernels.so, operating on host memory (the kernel tests, `check-gpu --dry-run`).
 */
#include "simt_emulator.h"

#include "deamoeForwardBf16.cu"
#include "deamoeForwardFloat.cu"
#include "deamoeForwardHalf.cu"
#include "deamoeKernels.cu"

// The few CUDA runtime calls the host code makes.
extern "C"
{
cudaError_t cudaPeekAtLastError(void)
{
    return simt::lastError;
}
cudaError_t cudaGetLastError(void)
{
    cudaError_t const error = simt::lastError;
    simt::lastError = cudaSuccess;
    return error;
}
char const* cudaGetErrorName(cudaError_t error)
{
    switch (error)
    {
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    default: return "cudaErrorEmulated";
    }
}

// Tests: the next `count` launches fail with CUDA error `error` (not running the kernel);
// returns the runtime's pending last error (cudaPeekAtLastError).
int32_t deamoe_emulator_fail_launches(int32_t count, int32_t error)
{
    simt::launchesToFail = count;
    simt::launchFailure = static_cast<cudaError_t>(error);
    return static_cast<int32_t>(simt::lastError);
}
char const* cudaGetErrorString(cudaError_t)
{
    return "emulated";
}
cudaError_t cudaGetDevice(int*)
{
    return cudaErrorNoDevice; // programmatic launch is never usable here
}
cudaError_t cudaDeviceGetAttribute(int*, cudaDeviceAttr, int)
{
    return cudaErrorNoDevice;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp*, int) // cudaGetDeviceProperties_v2 (a macro)
{
    return cudaErrorNoDevice;
}
}
