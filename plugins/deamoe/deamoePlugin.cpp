/*
 * DeaMoE TensorRT plugin: the glue between TensorRT's IPluginV3 interfaces and the kernels
 * of deamoeKernels.h. No math lives here: routing and the grouped SwiGLU are
 * deamoe::forward's; this file holds the plugin and its creator, which map node inputs to
 * LayerWeights and TensorRT's questions (shapes, types, formats, workspace) to answers.
 * Node fields become LayerParams in deamoePluginFields.cpp; the generic helpers (logging,
 * field readers, type names) are deamoePluginUtils.h's.
 *
 * Every noexcept method catches whatever it throws and reports it through TensorRT's
 * logger (falling back to stderr), so a bad node fails the build with a message instead
 * of terminating the process.
 */
#include "deamoePlugin.h"
#include "deamoePluginFields.h"
#include "deamoePluginUtils.h"

#include <NvInferRuntime.h>

#include <cstdlib>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

using TrtType = nvinfer1::DataType; // deamoe::DataType is the kernels' own enum
using nvinfer1::DimsExprs;
using nvinfer1::DynamicPluginTensorDesc;
using nvinfer1::ILogger;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldCollection;
using nvinfer1::PluginFieldType;
using nvinfer1::PluginTensorDesc;
using nvinfer1::TensorFormat;

namespace deamoe
{
namespace plugin
{

// ---------------------------------------------------------------------------------------
// DeaMoEPlugin
// ---------------------------------------------------------------------------------------

DeaMoEPlugin::DeaMoEPlugin(std::string layerName, LayerParams const& params)
    : mLayerName(std::move(layerName))
    , mParams(params)
{
    checkQuantization(mParams);
    Status const status = deamoe::validate(mParams);
    if (status != Status::kSUCCESS)
    {
        fail("invalid DeaMoE layer (" + describe(mParams) + "): " + kernelError(status));
    }
    mInputs = presentInputs(mParams);
    mMetadata = describe(mParams);
}

DeaMoEPlugin::DeaMoEPlugin(DeaMoEPlugin const& other)
    : mLayerName(other.mLayerName)
    , mNamespace(other.mNamespace)
    , mParams(other.mParams)
    , mInputs(other.mInputs)
    , mMetadata(other.mMetadata)
    , mTileVariants(other.mTileVariants)
    , mVariantsResolved(other.mVariantsResolved)
    , mErrorRecorder(other.mErrorRecorder)
{
    // mSerialFields point into their owner; a copy rebuilds its own in getFieldsToSerialize().
}

nvinfer1::IPluginCapability* DeaMoEPlugin::getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept
{
    return guarded<nvinfer1::IPluginCapability*>(
        "getCapabilityInterface", nullptr, [&]() -> nvinfer1::IPluginCapability* {
            switch (type)
            {
            case nvinfer1::PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
            case nvinfer1::PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuild*>(this);
            case nvinfer1::PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
            }
            fail("unknown capability type " + std::to_string(static_cast<int32_t>(type)));
        });
}

nvinfer1::IPluginV3* DeaMoEPlugin::clone() noexcept
{
    return guarded<nvinfer1::IPluginV3*>(
        "clone", nullptr, [&]() -> nvinfer1::IPluginV3* { return std::make_unique<DeaMoEPlugin>(*this).release(); });
}

char const* DeaMoEPlugin::getPluginName() const noexcept
{
    return kPLUGIN_NAME;
}

char const* DeaMoEPlugin::getPluginVersion() const noexcept
{
    return kPLUGIN_VERSION;
}

char const* DeaMoEPlugin::getPluginNamespace() const noexcept
{
    return mNamespace.c_str();
}

int32_t DeaMoEPlugin::getNbOutputs() const noexcept
{
    return 1;
}

int32_t DeaMoEPlugin::getOutputDataTypes(
    TrtType* outputTypes, int32_t nbOutputs, TrtType const* inputTypes, int32_t nbInputs) const noexcept
{
    return guarded<int32_t>("getOutputDataTypes", -1, [&]() -> int32_t {
        if (outputTypes == nullptr || inputTypes == nullptr || nbOutputs != 1)
        {
            fail("expected one output");
        }
        if (nbInputs != static_cast<int32_t>(mInputs.size()))
        {
            fail("layer '" + mLayerName + "' has " + std::to_string(nbInputs) + " inputs; its attributes (" + mMetadata
                + ") need " + std::to_string(mInputs.size()));
        }
        outputTypes[0] = inputTypes[0]; // output = hidden_states' dtype
        return 0;
    });
}

int32_t DeaMoEPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const* /*shapeInputs*/,
    int32_t nbShapeInputs, DimsExprs* outputs, int32_t nbOutputs, nvinfer1::IExprBuilder& /*exprBuilder*/) noexcept
{
    return guarded<int32_t>("getOutputShapes", -1, [&]() -> int32_t {
        if (inputs == nullptr || outputs == nullptr || nbOutputs != 1 || nbShapeInputs != 0)
        {
            fail("expected one output and no shape inputs");
        }
        if (nbInputs != static_cast<int32_t>(mInputs.size()))
        {
            fail("layer '" + mLayerName + "' has " + std::to_string(nbInputs) + " inputs; its attributes (" + mMetadata
                + ") need " + std::to_string(mInputs.size()));
        }
        if (inputs[0].nbDims != 2)
        {
            fail("hidden_states must be [T, d], got rank " + std::to_string(inputs[0].nbDims));
        }
        // Sizes are checked against the attributes in configurePlugin/onShapeChange, where
        // they are numbers rather than expressions.
        outputs[0] = inputs[0];
        return 0;
    });
}

bool DeaMoEPlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    return guarded<bool>("supportsFormatCombination", false, [&]() -> bool {
        if (inOut == nullptr || pos < 0 || pos >= nbInputs + nbOutputs)
        {
            return false;
        }
        PluginTensorDesc const& desc = inOut[pos].desc;
        if (desc.format != TensorFormat::kLINEAR)
        {
            return false;
        }
        // TensorRT asks position by position with the earlier positions already chosen: the
        // first input picks a float type, every other input and the output must match it,
        // except the router's (spec, "Router precision": router.bias is always float32,
        // router.weight float32 or the activation type) and a quantized node's packed codes.
        if (pos == 0)
        {
            return isSupportedType(desc.type);
        }
        InputRole const role
            = pos < nbInputs && pos < static_cast<int32_t>(mInputs.size()) ? mInputs[pos] : InputRole::kHIDDEN;
        TrtType const activation = inOut[0].desc.type;
        switch (inputType(mParams, role))
        {
        case InputType::kFLOAT32: return desc.type == TrtType::kFLOAT;
        case InputType::kFLOAT32_OR_ACTIVATION: return desc.type == activation || desc.type == TrtType::kFLOAT;
        case InputType::kCODES: return desc.type == kCODES_TYPE;
        case InputType::kACTIVATION: break;
        }
        return desc.type == activation;
    });
}

void DeaMoEPlugin::checkTensors(
    PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* out, int32_t nbOutputs) const
{
    if (in == nullptr || out == nullptr || nbOutputs != 1)
    {
        fail("expected one output");
    }
    if (nbInputs != static_cast<int32_t>(mInputs.size()))
    {
        fail("layer '" + mLayerName + "' has " + std::to_string(nbInputs) + " inputs; its attributes (" + mMetadata
            + ") need " + std::to_string(mInputs.size()));
    }
    for (int32_t i = 0; i < nbInputs; ++i)
    {
        InputRole const role = mInputs[i];
        std::vector<int64_t> const want = expectedShape(mParams, role);
        nvinfer1::Dims const& got = in[i].dims;
        bool ok = got.nbDims == static_cast<int32_t>(want.size());
        for (int32_t j = 0; ok && j < got.nbDims; ++j)
        {
            // -1: the token dimension, or any dimension TensorRT does not know yet at build time.
            ok = want[j] < 0 || got.d[j] < 0 || got.d[j] == want[j];
        }
        if (!ok)
        {
            fail("input " + std::to_string(i) + " (" + inputRoleName(role) + ") has shape " + dimsString(got)
                + " but the layer's attributes (" + mMetadata + ") need " + shapeString(want));
        }
        std::string const input = "input " + std::to_string(i) + " (" + inputRoleName(role) + ") is ";
        switch (inputType(mParams, role))
        {
        case InputType::kFLOAT32:
            // The router keeps its own precision (spec, "Router precision").
            if (in[i].type != TrtType::kFLOAT)
            {
                fail(input + typeName(in[i].type) + "; it must be float32");
            }
            break;
        case InputType::kCODES:
            if (in[i].type != kCODES_TYPE)
            {
                fail(input + typeName(in[i].type) + "; a quantized node (weight_bits "
                    + std::to_string(mParams.weightBits) + ") carries its FFN weights as " + typeName(kCODES_TYPE)
                    + " words of packed codes");
            }
            break;
        case InputType::kFLOAT32_OR_ACTIVATION:
            if (in[i].type == TrtType::kFLOAT)
            {
                break;
            }
            [[fallthrough]];
        case InputType::kACTIVATION:
            if (in[i].type != in[0].type)
            {
                fail(input + typeName(in[i].type) + " but hidden_states is " + typeName(in[0].type)
                    + "; the weights and scales share hidden_states' dtype (router.weight may also be float32)");
            }
            break;
        }
    }
    if (!isSupportedType(in[0].type))
    {
        fail(std::string("hidden_states is ") + typeName(in[0].type) + "; DeaMoE runs float32, float16 or bfloat16");
    }
    if (out[0].type != in[0].type || out[0].dims.nbDims != 2)
    {
        fail("the output must be [T, d] in hidden_states' dtype");
    }
    // The kernels' own limits (16-byte rows in this dtype, the routing block's shared
    // memory): fail here, while TensorRT builds or sets up the engine, not at enqueue.
    Status const supported = deamoe::checkSupported(mParams, toKernelType(in[0].type));
    if (supported != Status::kSUCCESS)
    {
        fail("layer '" + mLayerName + "' cannot run in " + typeName(in[0].type) + ": " + kernelError(supported));
    }
}

int32_t DeaMoEPlugin::configurePlugin(
    DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    return guarded<int32_t>("configurePlugin", -1, [&]() -> int32_t {
        if (in == nullptr || out == nullptr || nbInputs < 0 || nbOutputs < 0)
        {
            fail("null tensor descriptions");
        }
        std::vector<PluginTensorDesc> inDesc(static_cast<size_t>(nbInputs));
        std::vector<PluginTensorDesc> outDesc(static_cast<size_t>(nbOutputs));
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            inDesc[i] = in[i].desc;
        }
        for (int32_t i = 0; i < nbOutputs; ++i)
        {
            outDesc[i] = out[i].desc;
        }
        checkTensors(inDesc.data(), nbInputs, outDesc.data(), nbOutputs);
        return 0;
    });
}

size_t DeaMoEPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
    DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    return guarded<size_t>("getWorkspaceSize", 0, [&]() -> size_t {
        if (inputs == nullptr || nbInputs < 1)
        {
            fail("no inputs");
        }
        // Scratch for the most tokens this profile allows: TensorRT reserves it once per
        // context, and enqueue never needs more for fewer tokens.
        int32_t const maxTokens = clampTokens(inputs[0].max.d[0]);
        deamoe::DataType const dtype
            = isSupportedType(inputs[0].desc.type) ? toKernelType(inputs[0].desc.type) : deamoe::DataType::kFLOAT;
        return deamoe::workspaceSize(mParams, maxTokens, dtype);
    });
}

char const* DeaMoEPlugin::getMetadataString() noexcept
{
    return mMetadata.c_str();
}

int32_t DeaMoEPlugin::onShapeChange(
    PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    return guarded<int32_t>("onShapeChange", -1, [&]() -> int32_t {
        checkTensors(in, nbInputs, out, nbOutputs);
        return 0;
    });
}

void DeaMoEPlugin::resolveVariants()
{
    mVariantsResolved = true;
    char const* dir = std::getenv(kVARIANT_TABLES_ENV);
    char device[256];
    if (dir == nullptr || *dir == '\0' || deamoe::currentDeviceName(device, sizeof(device)) != Status::kSUCCESS)
    {
        return;
    }
    VariantTable table;
    try
    {
        if (!loadVariantTable(dir, device, table))
        {
            return;
        }
    }
    catch (std::invalid_argument const& e)
    {
        // A broken table costs speed, not correctness: run the default kernels, say why.
        logMessage(nvinfer1::ILogger::Severity::kWARNING,
            "layer '" + mLayerName + "': " + e.what() + "; running the default kernel variant");
        return;
    }
    std::string const shape = variantShapeKey(mParams);
    for (deamoe::DataType dtype : {deamoe::DataType::kFLOAT, deamoe::DataType::kHALF, deamoe::DataType::kBF16})
    {
        mTileVariants[static_cast<size_t>(dtype)] = table.tileVariants(shape, dtype, mParams.weightBits);
    }
    logMessage(nvinfer1::ILogger::Severity::kINFO,
        "layer '" + mLayerName + "': kernel variants from the table of " + table.device() + " in " + dir);
}

int32_t DeaMoEPlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /*outputDesc*/,
    void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept
{
    return guarded<int32_t>(
        "enqueue", -1,
        [&]() -> int32_t {
            if (inputDesc == nullptr || inputs == nullptr || outputs == nullptr)
            {
                fail("null inputs or outputs");
            }
            int64_t const tokens = inputDesc[0].dims.d[0];
            if (tokens == 0)
            {
                return 0; // an empty step: nothing to route, nothing to write
            }
            if (tokens < 0 || tokens > std::numeric_limits<int32_t>::max())
            {
                fail("hidden_states has " + std::to_string(tokens) + " tokens");
            }
            deamoe::DataType const dtype = toKernelType(inputDesc[0].type);

            LayerParams params = mParams;
            LayerWeights weights{};
            for (size_t i = 1; i < mInputs.size(); ++i)
            {
                void const* ptr = inputs[i];
                switch (mInputs[i])
                {
                case InputRole::kROUTER_WEIGHT:
                    weights.routerWeight = ptr;
                    params.routerWeightFloat32 = inputDesc[i].type == TrtType::kFLOAT ? 1 : 0;
                    break;
                case InputRole::kROUTER_BIAS: weights.routerBias = ptr; break;
                case InputRole::kDEPARTMENT_GATE_UP: weights.departmentGateUp = ptr; break;
                case InputRole::kDEPARTMENT_DOWN: weights.departmentDown = ptr; break;
                case InputRole::kEXPERT_GATE_UP: weights.expertGateUp = ptr; break;
                case InputRole::kEXPERT_DOWN: weights.expertDown = ptr; break;
                case InputRole::kSHARED_GATE_UP: weights.sharedGateUp = ptr; break;
                case InputRole::kSHARED_DOWN: weights.sharedDown = ptr; break;
                case InputRole::kSHARED_GATE: weights.sharedGate = ptr; break;
                case InputRole::kDEPARTMENT_GATE_UP_SCALES: weights.departmentGateUpScales = ptr; break;
                case InputRole::kDEPARTMENT_DOWN_SCALES: weights.departmentDownScales = ptr; break;
                case InputRole::kEXPERT_GATE_UP_SCALES: weights.expertGateUpScales = ptr; break;
                case InputRole::kEXPERT_DOWN_SCALES: weights.expertDownScales = ptr; break;
                case InputRole::kSHARED_GATE_UP_SCALES: weights.sharedGateUpScales = ptr; break;
                case InputRole::kSHARED_DOWN_SCALES: weights.sharedDownScales = ptr; break;
                case InputRole::kROUTER_LOGIT_BIAS: weights.routerLogitBias = ptr; break;
                case InputRole::kDEPARTMENT_GATE_UP_BIAS: weights.departmentGateUpBias = ptr; break;
                case InputRole::kEXPERT_GATE_UP_BIAS: weights.expertGateUpBias = ptr; break;
                case InputRole::kEXPERT_DOWN_BIAS: weights.expertDownBias = ptr; break;
                case InputRole::kSHARED_GATE_UP_BIAS: weights.sharedGateUpBias = ptr; break;
                case InputRole::kSHARED_DOWN_BIAS: weights.sharedDownBias = ptr; break;
                case InputRole::kHIDDEN: break;
                }
            }
            // enqueue is not told the workspace's size. TensorRT gave us at least
            // getWorkspaceSize() for the profile's max tokens, which covers this step's tokens,
            // so the bytes forward() may use are exactly what it asks for at this size.
            int32_t const numTokens = static_cast<int32_t>(tokens);
            size_t const workspaceBytes = deamoe::workspaceSize(params, numTokens, dtype);
            if (!mVariantsResolved)
            {
                resolveVariants();
            }
            int32_t const variant = mTileVariants[static_cast<size_t>(dtype)][tileIndex(numTokens)];
            Status const status = deamoe::forwardVariant(
                params, weights, dtype, variant, inputs[0], outputs[0], numTokens, workspace, workspaceBytes, stream);
            if (status != Status::kSUCCESS)
            {
                fail("layer '" + mLayerName + "': deamoe::forwardVariant failed for " + std::to_string(tokens)
                    + " token(s): " + kernelError(status));
            }
            return 0;
        },
        mErrorRecorder);
}

nvinfer1::IPluginV3* DeaMoEPlugin::attachToContext(nvinfer1::IPluginResourceContext* context) noexcept
{
    // No per-context resources (the workspace comes from TensorRT on every enqueue) except
    // the context's error recorder, where enqueue failures are reported.
    return guarded<nvinfer1::IPluginV3*>("attachToContext", nullptr, [&]() -> nvinfer1::IPluginV3* {
        auto attached = std::make_unique<DeaMoEPlugin>(*this);
        attached->mErrorRecorder = context != nullptr ? context->getErrorRecorder() : nullptr;
        return attached.release();
    });
}

PluginFieldCollection const* DeaMoEPlugin::getFieldsToSerialize() noexcept
{
    return guarded<PluginFieldCollection const*>(
        "getFieldsToSerialize", nullptr, [&]() -> PluginFieldCollection const* {
            // The same names and types the ONNX parser passes, so createPlugin() reads an engine's
            // fields exactly as it reads a node's.
            mScoreFuncName = scoreFuncName(mParams.scoreFunc);
            mDepartmentScoreName = departmentScoreName(mParams.departmentScore);
            mActivationName = activationName(mParams.activation);
            auto const text = [](std::string const& s) { return static_cast<int32_t>(s.size() + 1); };
            mSerialFields = {
                PluginField("hidden_size", &mParams.hidden, PluginFieldType::kINT32, 1),
                PluginField("num_departments", &mParams.numDepartments, PluginFieldType::kINT32, 1),
                PluginField("experts_per_department", &mParams.expertsPerDepartment, PluginFieldType::kINT32, 1),
                PluginField("shared_intermediate_size", &mParams.sharedWidth, PluginFieldType::kINT32, 1),
                PluginField("private_intermediate_size", &mParams.privateWidth, PluginFieldType::kINT32, 1),
                PluginField("top_k", &mParams.topK, PluginFieldType::kINT32, 1),
                PluginField("top_departments", &mParams.topDepartments, PluginFieldType::kINT32, 1),
                PluginField("score_func", mScoreFuncName.c_str(), PluginFieldType::kCHAR, text(mScoreFuncName)),
                PluginField("department_score", mDepartmentScoreName.c_str(), PluginFieldType::kCHAR,
                    text(mDepartmentScoreName)),
                PluginField("norm_topk_prob", &mParams.normTopkProb, PluginFieldType::kINT32, 1),
                PluginField("routed_scaling_factor", &mParams.routedScalingFactor, PluginFieldType::kFLOAT32, 1),
                PluginField("router_bias", &mParams.hasRouterBias, PluginFieldType::kINT32, 1),
                PluginField("shared_expert_intermediate_size", &mParams.sharedExpertWidth, PluginFieldType::kINT32, 1),
                PluginField("shared_expert_gate", &mParams.sharedExpertGate, PluginFieldType::kINT32, 1),
                PluginField("ffn_bias", &mParams.ffnBias, PluginFieldType::kINT32, 1),
                PluginField("activation", mActivationName.c_str(), PluginFieldType::kCHAR, text(mActivationName)),
                PluginField("swiglu_alpha", &mParams.swigluAlpha, PluginFieldType::kFLOAT32, 1),
                PluginField("swiglu_limit", &mParams.swigluLimit, PluginFieldType::kFLOAT32, 1),
                PluginField("router_logit_bias", &mParams.hasRouterLogitBias, PluginFieldType::kINT32, 1),
                PluginField("weight_bits", &mParams.weightBits, PluginFieldType::kINT32, 1),
                PluginField("weight_group_size", &mParams.weightGroupSize, PluginFieldType::kINT32, 1),
            };
            mSerialFC.nbFields = static_cast<int32_t>(mSerialFields.size());
            mSerialFC.fields = mSerialFields.data();
            return &mSerialFC;
        });
}

// ---------------------------------------------------------------------------------------
// DeaMoEPluginCreator
// ---------------------------------------------------------------------------------------

DeaMoEPluginCreator::DeaMoEPluginCreator()
{
    // The ONNX parser turns exactly these node attributes into PluginFields (a missing one is
    // skipped with a warning); the type here is informational, the parser uses the
    // attribute's own type.
    for (FieldSpec const& spec : kFIELDS)
    {
        mFieldNames.emplace_back(spec.name, nullptr, pluginFieldType(spec.kind), 1);
    }
    mFC.nbFields = static_cast<int32_t>(mFieldNames.size());
    mFC.fields = mFieldNames.data();
}

char const* DeaMoEPluginCreator::getPluginName() const noexcept
{
    return kPLUGIN_NAME;
}

char const* DeaMoEPluginCreator::getPluginVersion() const noexcept
{
    return kPLUGIN_VERSION;
}

char const* DeaMoEPluginCreator::getPluginNamespace() const noexcept
{
    return kPLUGIN_NAMESPACE;
}

PluginFieldCollection const* DeaMoEPluginCreator::getFieldNames() noexcept
{
    return &mFC;
}

nvinfer1::IPluginV3* DeaMoEPluginCreator::createPlugin(
    char const* name, PluginFieldCollection const* fc, nvinfer1::TensorRTPhase /*phase*/) noexcept
{
    // Build (fields from the ONNX node) and runtime (fields from getFieldsToSerialize) read
    // the same fields, so the phase changes nothing here.
    std::string const layer = name ? name : "";
    std::string const where = "createPlugin('" + layer + "')";
    return guarded<nvinfer1::IPluginV3*>(where.c_str(), nullptr, [&]() -> nvinfer1::IPluginV3* {
        if (fc == nullptr)
        {
            fail("no fields");
        }
        return std::make_unique<DeaMoEPlugin>(layer, paramsFromFields(*fc)).release();
    });
}

#if !(defined(DEAMOE_PLUGIN_DYNAMIC) && DEAMOE_PLUGIN_DYNAMIC)
// Loading libdeamoe_plugin.so (dlopen, ctypes.CDLL, trtexec --staticPlugins, polygraphy
// --plugins) registers the creator in the global registry under namespace "".
REGISTER_TENSORRT_PLUGIN(DeaMoEPluginCreator);
#endif

} // namespace plugin
} // namespace deamoe

#if defined(DEAMOE_PLUGIN_DYNAMIC) && DEAMOE_PLUGIN_DYNAMIC
extern "C" nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    static deamoe::plugin::DeaMoEPluginCreator sCreator;
    static nvinfer1::IPluginCreatorInterface* const sCreators[] = {&sCreator};
    nbCreators = 1;
    return sCreators;
}

extern "C" void setLoggerFinder(nvinfer1::ILoggerFinder* finder)
{
    if (finder != nullptr)
    {
        deamoe::plugin::gLoggerFinder.store(finder);
    }
}
#endif
