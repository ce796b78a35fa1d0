# The CUDA architectures the DeaMoE kernels compile for, shared by the kernel library's own
# project (native/cuda/CMakeLists.txt) and the plugin's (plugins/CMakeLists.txt).
#
# Include this file before project(): the default list depends on the CUDA version, which
# CMake only knows after enable_language(CUDA), so it remembers whether the user chose and
# lets the compiler check run with an architecture every supported nvcc (12.x, 13.x)
# accepts. Call deamoe_cuda_architectures() after project() to set the default list:
# "86;87;89;90;110" (A40, Orin, Ada, Hopper, Thor); 110 becomes 101 on CUDA 12.8/12.9 and is
# dropped before 12.8. CMAKE_CUDA_ARCHITECTURES or the CUDAARCHS environment variable
# overrides it.

if(DEFINED CMAKE_CUDA_ARCHITECTURES OR DEFINED ENV{CUDAARCHS})
  set(DEAMOE_USER_CUDA_ARCHITECTURES ON)
else()
  set(DEAMOE_USER_CUDA_ARCHITECTURES OFF)
  set(CMAKE_CUDA_ARCHITECTURES 86)
endif()

macro(deamoe_cuda_architectures)
  if(NOT DEAMOE_USER_CUDA_ARCHITECTURES)
    set(_deamoe_archs 86 87 89 90)
    if(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 13.0)
      list(APPEND _deamoe_archs 110)       # Thor
    elseif(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.8)
      list(APPEND _deamoe_archs 101)       # Thor's name before CUDA 13
    else()
      message(STATUS "DeaMoE: CUDA ${CMAKE_CUDA_COMPILER_VERSION} cannot build for Thor; skipping it")
    endif()
    set(CMAKE_CUDA_ARCHITECTURES ${_deamoe_archs})
  endif()
  message(STATUS "DeaMoE: CUDA ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")
endmacro()
