/*
 * DeaMoE TensorRT plugin (IPluginV3): one DeaMoE layer of docs/spec.md as
 * one TensorRT layer. It consumes the ONNX node described in README.md (op_type DeaMoE,
 * plugin name/version/namespace DeaMoE/1/"") and runs deamoe::forward (deamoeKernels.h).
 *
 * Built against TensorRT 10.3 (JetPack 6) up to 11.x; see README.md, "TensorRT versions".
 */
#pragma once

#include "deamoeKernels.h"
#include "deamoeVariantTable.h"

#include <NvInferRuntime.h>
#include <NvInferVersion.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#if NV_TENSORRT_MAJOR < 10 || (NV_TENSORRT_MAJOR == 10 && NV_TENSORRT_MINOR < 3)
#error "The DeaMoE plugin needs TensorRT 10.3 or newer (IPluginV3, getCreators); JetPack 6 ships 10.3."
#endif

namespace deamoe
{
namespace plugin
{

// Plugin identity: what the ONNX parser looks up from op_type, plugin_version and
// plugin_namespace of the node (README.md, "The ONNX node it consumes").
constexpr char const* kPLUGIN_NAME{"DeaMoE"};
constexpr char const* kPLUGIN_VERSION{"1"};
constexpr char const* kPLUGIN_NAMESPACE{""};

// What each input of the node is. The node carries only the inputs its config says are
// present, in this order, so the position of a role depends on the config.
enum class InputRole : int32_t
{
    kHIDDEN = 0,
    kROUTER_WEIGHT,
    kROUTER_BIAS,
    kDEPARTMENT_GATE_UP,
    kDEPARTMENT_DOWN,
    kEXPERT_GATE_UP,
    kEXPERT_DOWN,
    kSHARED_GATE_UP,
    kSHARED_DOWN,
    kSHARED_GATE,
    // A quantized node's (weightBits > 0) scales, appended so float nodes keep their positions.
    kDEPARTMENT_GATE_UP_SCALES,
    kDEPARTMENT_DOWN_SCALES,
    kEXPERT_GATE_UP_SCALES,
    kEXPERT_DOWN_SCALES,
    kSHARED_GATE_UP_SCALES,
    kSHARED_DOWN_SCALES,
    // The logit bias and the FFN biases (ffnBias), appended so earlier nodes keep their positions.
    kROUTER_LOGIT_BIAS,
    kDEPARTMENT_GATE_UP_BIAS,
    kEXPERT_GATE_UP_BIAS,
    kEXPERT_DOWN_BIAS,
    kSHARED_GATE_UP_BIAS,
    kSHARED_DOWN_BIAS,
};

// A quantized node's FFN weight inputs carry the checkpoint's packed codes (uint8 bytes, two
// int4 codes per byte) as int32 words of 4 bytes: the same bytes in memory, in a type every
// TensorRT version takes as a plugin input and an ONNX initializer (README.md, "Quantized
// nodes"). Their last dim is cols * weightBits / kCODE_WORD_BITS.
constexpr nvinfer1::DataType kCODES_TYPE{nvinfer1::DataType::kINT32};
constexpr int32_t kCODE_WORD_BITS{32};

// The element type an input must have: hidden_states' (the activation dtype), float32,
// either of the two, or packed codes (kCODES_TYPE).
enum class InputType : int32_t
{
    kACTIVATION,
    kFLOAT32,
    kFLOAT32_OR_ACTIVATION,
    kCODES,
};

char const* inputRoleName(InputRole role) noexcept;

// The present inputs of a layer with these params, in node order.
std::vector<InputRole> presentInputs(LayerParams const& params);

// The shape of input `role` as the contract states it, codes unpacked ([rows, cols] of
// weights); -1 marks the token dimension of hidden_states.
std::vector<int64_t> logicalShape(LayerParams const& params, InputRole role);

// The shape input `role` must have: logicalShape, with a quantized weight's last dim packed.
std::vector<int64_t> expectedShape(LayerParams const& params, InputRole role);

// The element type input `role` must have in a layer of params.
InputType inputType(LayerParams const& params, InputRole role) noexcept;

// Throws std::invalid_argument naming the field when weight_bits/weight_group_size are not a
// quantization the node format has (bits 0, 4 or 8; group 16, 32, 64 or 128 dividing every
// quantized width; 0 when float).
void checkQuantization(LayerParams const& params);

// PluginFields (from the ONNX parser, the Python API or a serialized engine) to LayerParams.
// Throws std::invalid_argument naming the offending field. Accepts ints as any integer
// field type, floats as kFLOAT32/kFLOAT64, strings as kCHAR with or without the trailing
// NUL the ONNX parser appends.
LayerParams paramsFromFields(nvinfer1::PluginFieldCollection const& fc);

// One line describing the params, for errors and the engine's layer information.
std::string describe(LayerParams const& params);

class DeaMoEPlugin : public nvinfer1::IPluginV3,
                     public nvinfer1::IPluginV3OneCore,
                     public nvinfer1::IPluginV3OneBuild,
                     public nvinfer1::IPluginV3OneRuntime
{
public:
    // Throws std::invalid_argument when params are not a valid layer (checkQuantization,
    // deamoe::validate).
    DeaMoEPlugin(std::string layerName, LayerParams const& params);
    DeaMoEPlugin(DeaMoEPlugin const& other);
    DeaMoEPlugin& operator=(DeaMoEPlugin const&) = delete;
    ~DeaMoEPlugin() override = default;

    LayerParams const& params() const noexcept { return mParams; }

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
    nvinfer1::IPluginV3* clone() noexcept override;

    // IPluginV3OneCore
    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;

    // IPluginV3OneBuild
    int32_t getNbOutputs() const noexcept override;
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs, nvinfer1::DataType const* inputTypes,
        int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs, nvinfer1::DimsExprs const* shapeInputs,
        int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
        nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
        int32_t nbOutputs) noexcept override;
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;
    char const* getMetadataString() noexcept override;

    // IPluginV3OneRuntime
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs, nvinfer1::PluginTensorDesc const* out,
        int32_t nbOutputs) noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

private:
    // Throws std::invalid_argument when the tensors do not fit the params.
    void checkTensors(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs, nvinfer1::PluginTensorDesc const* out,
        int32_t nbOutputs) const;

    std::string mLayerName;
    std::string mNamespace{kPLUGIN_NAMESPACE};
    LayerParams mParams;
    std::vector<InputRole> mInputs;
    std::string mMetadata;
    // The kernel variant per dtype (deamoe::DataType) and token tile (kTILE_TOKENS) that this
    // GPU's variant table lists for the layer (deamoeVariantTable.h), read on the first
    // enqueue (resolveVariants); all 0, the default kernels, without a table.
    void resolveVariants();
    std::array<std::array<int32_t, kTILE_TOKENS.size()>, 3> mTileVariants{};
    bool mVariantsResolved{false};
    // The execution context's error recorder (attachToContext), or nullptr: enqueue
    // failures are reported there as well as to the logger. Not owned.
    nvinfer1::IErrorRecorder* mErrorRecorder{nullptr};

    // Backing storage of getFieldsToSerialize(): the collection points into these members,
    // so it stays valid for the plugin's lifetime and is rebuilt on every call.
    std::string mScoreFuncName;
    std::string mDepartmentScoreName;
    std::string mActivationName;
    std::vector<nvinfer1::PluginField> mSerialFields;
    nvinfer1::PluginFieldCollection mSerialFC{};
};

class DeaMoEPluginCreator : public nvinfer1::IPluginCreatorV3One
{
public:
    DeaMoEPluginCreator();
    ~DeaMoEPluginCreator() override = default;

    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override;
    nvinfer1::IPluginV3* createPlugin(
        char const* name, nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase phase) noexcept override;

private:
    std::vector<nvinfer1::PluginField> mFieldNames;
    nvinfer1::PluginFieldCollection mFC{};
};

} // namespace plugin
} // namespace deamoe

// Entry points of the dynamically loaded library variant (libdeamoe_plugin_dynamic.so, built
// with DEAMOE_PLUGIN_DYNAMIC=1): IPluginRegistry::loadLibrary / trtexec --dynamicPlugins look
// these up by name. The statically registered variant (libdeamoe_plugin.so) does not export
// them, because loadLibrary fails when a creator it returns is already registered.
#if defined(DEAMOE_PLUGIN_DYNAMIC) && DEAMOE_PLUGIN_DYNAMIC
#if defined(_WIN32)
#define DEAMOE_PLUGIN_EXPORT __declspec(dllexport)
#else
#define DEAMOE_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif
extern "C"
{
DEAMOE_PLUGIN_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators);
DEAMOE_PLUGIN_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder);
}
#endif
