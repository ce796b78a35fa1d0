# The DeaMoE TensorRT plugin libraries. plugins/CMakeLists.txt include()s this file when
# TENSORRT_ROOT is set, after it has added the kernel library (native/cuda/).
#
#   cmake -S plugins -B build/plugins -DTENSORRT_ROOT=/path/to/TensorRT   # or /usr on JetPack
#   cmake --build build/plugins -j
#
# Inputs
#   TENSORRT_ROOT              TensorRT install: a tarball layout (include/, lib/)
#                              or a system prefix (/usr: include/<arch>-linux-gnu, lib/<arch>-linux-gnu).
#   DEAMOE_KERNELS_TARGET      the kernel library target (default: deamoe::kernels, the static,
#                              position-independent libdeamoe_kernels.a of native/cuda/CMakeLists.txt).
#   DEAMOE_PLUGIN_ALLOW_MISSING_NVINFER
#                              OFF (default): libnvinfer must be found. ON: build against
#                              headers only, leaving libnvinfer's symbols to be resolved when
#                              the library is loaded into a TensorRT process (compile checks).
#
# Targets (both from deamoePlugin*.cpp; see README.md, "Which library to load")
#   deamoe_plugin          libdeamoe_plugin.so: registers its creator when loaded
#                          (REGISTER_TENSORRT_PLUGIN). For dlopen/ctypes, trtexec
#                          --staticPlugins, polygraphy --plugins, deamoe-trt --plugin.
#   deamoe_plugin_dynamic  libdeamoe_plugin_dynamic.so: exports getCreators/setLoggerFinder,
#                          registers nothing itself and does not link libnvinfer. For
#                          IPluginRegistry::loadLibrary, trtexec --dynamicPlugins and
#                          version-compatible engines. Two files
#                          because loadLibrary fails if a creator it returns is already
#                          registered, which static registration would have done at dlopen.
#
# Needs CMake >= 3.18 (CUDAToolkit, LINKER: options); the including project sets the minimum.

set(DEAMOE_KERNELS_TARGET "deamoe::kernels" CACHE STRING "Kernel library target the DeaMoE plugin links")
option(DEAMOE_PLUGIN_ALLOW_MISSING_NVINFER "Build the DeaMoE plugin against TensorRT headers only" OFF)

if(NOT TENSORRT_ROOT)
  message(FATAL_ERROR "DeaMoE plugin: set -DTENSORRT_ROOT=<TensorRT install prefix> (JetPack: /usr)")
endif()
if(NOT TARGET ${DEAMOE_KERNELS_TARGET})
  message(FATAL_ERROR "DeaMoE plugin: kernel target '${DEAMOE_KERNELS_TARGET}' is not defined; "
                      "include plugin.cmake after it, or set -DDEAMOE_KERNELS_TARGET=<name>")
endif()

if(CMAKE_LIBRARY_ARCHITECTURE)
  set(_deamoe_arch_suffix "${CMAKE_LIBRARY_ARCHITECTURE}")
else()
  set(_deamoe_arch_suffix "${CMAKE_SYSTEM_PROCESSOR}-linux-gnu")
endif()

find_path(TENSORRT_INCLUDE_DIR NvInferRuntime.h
  HINTS "${TENSORRT_ROOT}"
  PATH_SUFFIXES include "include/${_deamoe_arch_suffix}"
  NO_DEFAULT_PATH)
if(NOT TENSORRT_INCLUDE_DIR)
  message(FATAL_ERROR "DeaMoE plugin: no NvInferRuntime.h under ${TENSORRT_ROOT}/include "
                      "(or include/${_deamoe_arch_suffix}); is TENSORRT_ROOT a TensorRT install?")
endif()

# TensorRT's version, from NvInferVersion.h: 10.3 spells NV_TENSORRT_MAJOR out, later
# releases define it through TRT_MAJOR_ENTERPRISE.
file(READ "${TENSORRT_INCLUDE_DIR}/NvInferVersion.h" _deamoe_trt_version_h)
foreach(_part MAJOR MINOR PATCH)
  string(REGEX MATCH "#define (NV_TENSORRT_${_part}|TRT_${_part}_ENTERPRISE) ([0-9]+)" _match "${_deamoe_trt_version_h}")
  set(_deamoe_trt_${_part} "${CMAKE_MATCH_2}")
endforeach()
set(DEAMOE_TENSORRT_VERSION "${_deamoe_trt_MAJOR}.${_deamoe_trt_MINOR}.${_deamoe_trt_PATCH}")
if(DEAMOE_TENSORRT_VERSION VERSION_LESS 10.3)
  message(FATAL_ERROR "DeaMoE plugin: TensorRT ${DEAMOE_TENSORRT_VERSION} at ${TENSORRT_INCLUDE_DIR}; "
                      "the plugin needs 10.3 or newer (IPluginV3 with getCreators)")
endif()

# libnvinfer: nvinfer on Linux (libnvinfer.so.10/.11), nvinfer_<major> on Windows.
find_library(TENSORRT_NVINFER_LIBRARY
  NAMES nvinfer "nvinfer_${_deamoe_trt_MAJOR}"
  HINTS "${TENSORRT_ROOT}"
  PATH_SUFFIXES lib lib64 "lib/${_deamoe_arch_suffix}"
  NO_DEFAULT_PATH)
if(NOT TENSORRT_NVINFER_LIBRARY)
  if(DEAMOE_PLUGIN_ALLOW_MISSING_NVINFER)
    message(WARNING "DeaMoE plugin: no libnvinfer under ${TENSORRT_ROOT}; building against headers only "
                    "(the libraries load only into a process that already has libnvinfer loaded globally)")
  else()
    message(FATAL_ERROR "DeaMoE plugin: no libnvinfer under ${TENSORRT_ROOT}/lib; point TENSORRT_ROOT at a "
                        "full TensorRT install, or pass -DDEAMOE_PLUGIN_ALLOW_MISSING_NVINFER=ON for a compile check")
  endif()
endif()

find_package(CUDAToolkit REQUIRED)
message(STATUS "DeaMoE plugin: TensorRT ${DEAMOE_TENSORRT_VERSION} (${TENSORRT_INCLUDE_DIR}), "
               "libnvinfer: ${TENSORRT_NVINFER_LIBRARY}, kernels: ${DEAMOE_KERNELS_TARGET}")

set(_deamoe_plugin_dir "${CMAKE_CURRENT_LIST_DIR}")
# The plugin's sources (tests/plugins/deamoe/test_plugin_cpp.py compiles the same .cpp files).
set(_deamoe_plugin_sources
  "${_deamoe_plugin_dir}/deamoePlugin.cpp" "${_deamoe_plugin_dir}/deamoePlugin.h"
  "${_deamoe_plugin_dir}/deamoePluginFields.cpp" "${_deamoe_plugin_dir}/deamoePluginFields.h"
  "${_deamoe_plugin_dir}/deamoePluginUtils.cpp" "${_deamoe_plugin_dir}/deamoePluginUtils.h"
  "${_deamoe_plugin_dir}/deamoeVariantTable.cpp" "${_deamoe_plugin_dir}/deamoeVariantTable.h")

function(_deamoe_add_plugin_library name dynamic)
  add_library(${name} SHARED ${_deamoe_plugin_sources})
  target_compile_features(${name} PRIVATE cxx_std_17)
  target_compile_definitions(${name} PRIVATE DEAMOE_PLUGIN_DYNAMIC=${dynamic})
  target_include_directories(${name} PRIVATE "${_deamoe_plugin_dir}")
  # SYSTEM: TensorRT's own headers use deprecated declarations; our warnings stay ours.
  target_include_directories(${name} SYSTEM PRIVATE "${TENSORRT_INCLUDE_DIR}")
  # The kernel library brings the CUDA runtime (cudart_static) and its headers; linking a
  # second, shared cudart here would give the plugin two runtimes.
  target_link_libraries(${name} PRIVATE ${DEAMOE_KERNELS_TARGET})
  # Only the self-registering library calls into libnvinfer (getPluginRegistry, getLogger).
  # The dynamic one uses nothing from it (TensorRT hands it a logger finder), so it does not
  # depend on it, as a library serialised into a version-compatible engine should not.
  if(dynamic OR TENSORRT_NVINFER_LIBRARY)
    if(NOT dynamic)
      target_link_libraries(${name} PRIVATE "${TENSORRT_NVINFER_LIBRARY}")
    endif()
    if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
      # Every symbol must resolve now: a kernel entry point missing from the kernel library
      # is a link error here rather than a dlopen error on the device.
      target_link_options(${name} PRIVATE "LINKER:--no-undefined")
    endif()
  endif()
  if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
    # Keep a static kernel library's symbols inside: two DeaMoE plugin libraries (or the
    # plugin and deamoe_trt.cuda's library) in one process must not interpose each other.
    target_link_options(${name} PRIVATE "LINKER:--exclude-libs,ALL")
  endif()
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${name} PRIVATE -Wall -Wextra)
  endif()
  set_target_properties(${name} PROPERTIES
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    # If the kernel target is ever a shared library: find it next to the plugin.
    BUILD_RPATH "$ORIGIN"
    INSTALL_RPATH "$ORIGIN")
endfunction()

_deamoe_add_plugin_library(deamoe_plugin 0)
_deamoe_add_plugin_library(deamoe_plugin_dynamic 1)

install(TARGETS deamoe_plugin deamoe_plugin_dynamic
  LIBRARY DESTINATION lib
  RUNTIME DESTINATION bin)
