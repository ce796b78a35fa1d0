/*
 * Generic helpers of the DeaMoE TensorRT plugin (deamoePlugin.cpp, deamoePluginFields.cpp):
 * reporting through TensorRT's logger, reading scalar PluginFields, and naming tensor types
 * and shapes in messages. Nothing here knows DeaMoE's attributes (deamoePluginFields.h does).
 */
#pragma once

#include "deamoeKernels.h"

#include <NvInferRuntime.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace deamoe
{
namespace plugin
{

// ---------------------------------------------------------------------------------------
// Reporting
// ---------------------------------------------------------------------------------------

// Set by setLoggerFinder() when TensorRT loads the dynamic library variant; the logger it
// finds is the one of the builder/runtime that is calling us.
extern std::atomic<nvinfer1::ILoggerFinder*> gLoggerFinder;

void logMessage(nvinfer1::ILogger::Severity severity, std::string const& message) noexcept;

// Logs the error and, when the plugin is attached to an execution context that has an
// error recorder, records it there too (TensorRT's error path for enqueue failures).
void reportError(char const* where, char const* what, nvinfer1::IErrorRecorder* recorder = nullptr) noexcept;

// Wraps the body of a noexcept method: an exception becomes a reported error and `onError`.
template <typename Result, typename Body>
Result guarded(char const* where, Result onError, Body&& body, nvinfer1::IErrorRecorder* recorder = nullptr) noexcept
{
    try
    {
        return body();
    }
    catch (std::exception const& e)
    {
        reportError(where, e.what(), recorder);
    }
    catch (...)
    {
        reportError(where, "unknown exception", recorder);
    }
    return onError;
}

// Throws std::invalid_argument: the error every check of the plugin raises.
[[noreturn]] void fail(std::string const& message);

// ---------------------------------------------------------------------------------------
// PluginField readers: each checks the field holds one value of a usable type and names
// the field when it does not.
// ---------------------------------------------------------------------------------------

void checkScalar(nvinfer1::PluginField const& field);

// ONNX INT attributes arrive as kINT32 from the parser; other callers may send int64 etc.
int64_t readInteger(nvinfer1::PluginField const& field);
int32_t readInt32(nvinfer1::PluginField const& field);
int32_t readBool(nvinfer1::PluginField const& field);
float readFloat(nvinfer1::PluginField const& field);

// The ONNX parser sends a STRING attribute as kCHAR with length = characters + 1 (it appends
// a NUL); other callers may not, so read up to the first NUL within length.
std::string readString(nvinfer1::PluginField const& field);

// ---------------------------------------------------------------------------------------
// Tensors
// ---------------------------------------------------------------------------------------

bool isSupportedType(nvinfer1::DataType type);
deamoe::DataType toKernelType(nvinfer1::DataType type);
char const* typeName(nvinfer1::DataType type);
std::string dimsString(nvinfer1::Dims const& dims);
std::string shapeString(std::vector<int64_t> const& shape);

// The kernels' status and, when they give one, their reason (for kCUDA_ERROR: the failed
// launch and the CUDA error, so the plugin never calls the CUDA runtime itself).
std::string kernelError(Status status);

int32_t clampTokens(int64_t tokens);

} // namespace plugin
} // namespace deamoe
