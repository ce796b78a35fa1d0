/*
 * Generic helpers of the DeaMoE TensorRT plugin; see deamoePluginUtils.h.
 */
#include "deamoePluginUtils.h"

#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>

using TrtType = nvinfer1::DataType; // deamoe::DataType is the kernels' own enum
using nvinfer1::ILogger;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldType;

namespace deamoe
{
namespace plugin
{

// ---------------------------------------------------------------------------------------
// Reporting
// ---------------------------------------------------------------------------------------

std::atomic<nvinfer1::ILoggerFinder*> gLoggerFinder{nullptr};

namespace
{

ILogger* currentLogger() noexcept
{
    if (nvinfer1::ILoggerFinder* finder = gLoggerFinder.load())
    {
        try
        {
            if (ILogger* logger = finder->findLogger())
            {
                return logger;
            }
        }
        catch (...)
        {
        }
    }
#if !(defined(DEAMOE_PLUGIN_DYNAMIC) && DEAMOE_PLUGIN_DYNAMIC)
    // libnvinfer's logger: the one handed to the last builder/runtime created. Only the
    // statically registered variant may call into libnvinfer like this; the dynamic one can
    // be loaded by a lean runtime that has no such symbol.
    return getLogger();
#else
    return nullptr;
#endif
}

} // namespace

void logMessage(ILogger::Severity severity, std::string const& message) noexcept
{
    try
    {
        std::string const text = "[DeaMoE plugin] " + message;
        if (ILogger* logger = currentLogger())
        {
            logger->log(severity, text.c_str());
            return;
        }
        std::fprintf(stderr, "%s\n", text.c_str());
    }
    catch (...)
    {
        // Logging must never be the reason a noexcept method terminates the process.
    }
}

void reportError(char const* where, char const* what, nvinfer1::IErrorRecorder* recorder) noexcept
{
    try
    {
        std::string const message = std::string(where) + ": " + what;
        logMessage(ILogger::Severity::kERROR, message);
        if (recorder != nullptr)
        {
            std::string const recorded = "[DeaMoE plugin] " + message;
            (void) recorder->reportError(nvinfer1::ErrorCode::kFAILED_EXECUTION, recorded.c_str());
        }
    }
    catch (...)
    {
    }
}

[[noreturn]] void fail(std::string const& message)
{
    throw std::invalid_argument(message);
}

// ---------------------------------------------------------------------------------------
// PluginField readers
// ---------------------------------------------------------------------------------------

void checkScalar(PluginField const& field)
{
    if (field.data == nullptr || field.length < 1)
    {
        fail(std::string("field '") + field.name + "' has no value");
    }
    if (field.length != 1)
    {
        fail(std::string("field '") + field.name + "' must be a scalar, got " + std::to_string(field.length)
            + " values");
    }
}

int64_t readInteger(PluginField const& field)
{
    checkScalar(field);
    switch (field.type)
    {
    case PluginFieldType::kINT8: return *static_cast<int8_t const*>(field.data);
    case PluginFieldType::kINT16: return *static_cast<int16_t const*>(field.data);
    case PluginFieldType::kINT32: return *static_cast<int32_t const*>(field.data);
    case PluginFieldType::kINT64: return *static_cast<int64_t const*>(field.data);
    default: break;
    }
    fail(std::string("field '") + field.name + "' must be an integer (kINT32), got PluginFieldType "
        + std::to_string(static_cast<int32_t>(field.type)));
}

int32_t readInt32(PluginField const& field)
{
    int64_t const value = readInteger(field);
    if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max())
    {
        fail(std::string("field '") + field.name + "' is out of the int32 range: " + std::to_string(value));
    }
    return static_cast<int32_t>(value);
}

int32_t readBool(PluginField const& field)
{
    int64_t const value = readInteger(field);
    if (value != 0 && value != 1)
    {
        fail(std::string("field '") + field.name + "' must be 0 or 1, got " + std::to_string(value));
    }
    return static_cast<int32_t>(value);
}

float readFloat(PluginField const& field)
{
    checkScalar(field);
    switch (field.type)
    {
    case PluginFieldType::kFLOAT32: return *static_cast<float const*>(field.data);
    case PluginFieldType::kFLOAT64: return static_cast<float>(*static_cast<double const*>(field.data));
    // An exporter that wrote routed_scaling_factor=2 as an INT attribute still means 2.0.
    case PluginFieldType::kINT32:
    case PluginFieldType::kINT64: return static_cast<float>(readInteger(field));
    default: break;
    }
    fail(std::string("field '") + field.name + "' must be a float (kFLOAT32), got PluginFieldType "
        + std::to_string(static_cast<int32_t>(field.type)));
}

std::string readString(PluginField const& field)
{
    if (field.type != PluginFieldType::kCHAR)
    {
        fail(std::string("field '") + field.name + "' must be a string (kCHAR), got PluginFieldType "
            + std::to_string(static_cast<int32_t>(field.type)));
    }
    if (field.data == nullptr || field.length < 0)
    {
        fail(std::string("field '") + field.name + "' has no value");
    }
    auto const* chars = static_cast<char const*>(field.data);
    return std::string(chars, strnlen(chars, static_cast<size_t>(field.length)));
}

// ---------------------------------------------------------------------------------------
// Tensors
// ---------------------------------------------------------------------------------------

bool isSupportedType(TrtType type)
{
    return type == TrtType::kFLOAT || type == TrtType::kHALF || type == TrtType::kBF16;
}

deamoe::DataType toKernelType(TrtType type)
{
    switch (type)
    {
    case TrtType::kFLOAT: return deamoe::DataType::kFLOAT;
    case TrtType::kHALF: return deamoe::DataType::kHALF;
    case TrtType::kBF16: return deamoe::DataType::kBF16;
    default: break;
    }
    fail("unsupported tensor type " + std::to_string(static_cast<int32_t>(type))
        + " (DeaMoE runs float32, float16 or bfloat16)");
}

char const* typeName(TrtType type)
{
    switch (type)
    {
    case TrtType::kFLOAT: return "float32";
    case TrtType::kHALF: return "float16";
    case TrtType::kBF16: return "bfloat16";
    case TrtType::kINT32: return "int32";
    case TrtType::kINT64: return "int64";
    case TrtType::kINT8: return "int8";
    case TrtType::kUINT8: return "uint8";
    case TrtType::kINT4: return "int4";
    case TrtType::kBOOL: return "bool";
    case TrtType::kFP8: return "fp8";
    default: break;
    }
    return "an unsupported type";
}

std::string dimsString(nvinfer1::Dims const& dims)
{
    std::ostringstream out;
    out << "[";
    for (int32_t i = 0; i < dims.nbDims; ++i)
    {
        out << (i ? ", " : "") << dims.d[i];
    }
    out << "]";
    return out.str();
}

std::string shapeString(std::vector<int64_t> const& shape)
{
    std::ostringstream out;
    out << "[";
    for (size_t i = 0; i < shape.size(); ++i)
    {
        out << (i ? ", " : "");
        if (shape[i] < 0)
        {
            out << "T";
        }
        else
        {
            out << shape[i];
        }
    }
    out << "]";
    return out.str();
}

std::string kernelError(Status status)
{
    std::string text = statusString(status);
    char const* reason = lastErrorMessage();
    if (reason != nullptr && reason[0] != '\0')
    {
        text += std::string(": ") + reason;
    }
    return text;
}

int32_t clampTokens(int64_t tokens)
{
    if (tokens < 1)
    {
        return 1;
    }
    return tokens > std::numeric_limits<int32_t>::max() ? std::numeric_limits<int32_t>::max()
                                                        : static_cast<int32_t>(tokens);
}

} // namespace plugin
} // namespace deamoe
