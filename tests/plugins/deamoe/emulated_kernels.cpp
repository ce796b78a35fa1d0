/*
 * The kernel library (plugins/deamoe/deamoeKernels.cu and the three dtype instantiations)
 * built for the CPU under the SIMT emulator: libdeamoe_emulated.so exports the same C ABI
 * as libdeamoe_kernels.so, operating on host memory. Tests only.
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
    return cudaSuccess;
}
char const* cudaGetErrorName(cudaError_t)
{
    return "cudaErrorEmulated";
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
}
