/*
 * DeaMoE node attributes (PluginFields) to LayerParams and the node's inputs: the field
 * table's readers and the free functions of deamoePlugin.h.
 */
#include "deamoePluginFields.h"
#include "deamoePluginUtils.h"

#include <set>
#include <sstream>

using nvinfer1::PluginField;
using nvinfer1::PluginFieldCollection;
using nvinfer1::PluginFieldType;

namespace deamoe
{
namespace plugin
{

PluginFieldType pluginFieldType(FieldKind kind)
{
    switch (kind)
    {
    case FieldKind::kINT:
    case FieldKind::kBOOL: return PluginFieldType::kINT32;
    case FieldKind::kFLOAT: return PluginFieldType::kFLOAT32;
    case FieldKind::kSTRING: return PluginFieldType::kCHAR;
    }
    return PluginFieldType::kUNKNOWN;
}

char const* scoreFuncName(ScoreFunc value)
{
    return value == ScoreFunc::kSIGMOID ? "sigmoid" : "softmax";
}

char const* departmentScoreName(DepartmentScore value)
{
    switch (value)
    {
    case DepartmentScore::kSUM_TOP2: return "sum_top2";
    case DepartmentScore::kSUM: return "sum";
    case DepartmentScore::kMAX: break;
    }
    return "max";
}

ScoreFunc parseScoreFunc(std::string const& text)
{
    if (text == "softmax")
    {
        return ScoreFunc::kSOFTMAX;
    }
    if (text == "sigmoid")
    {
        return ScoreFunc::kSIGMOID;
    }
    fail("field 'score_func' must be 'softmax' or 'sigmoid', got '" + text + "'");
}

DepartmentScore parseDepartmentScore(std::string const& text)
{
    if (text == "max")
    {
        return DepartmentScore::kMAX;
    }
    if (text == "sum_top2")
    {
        return DepartmentScore::kSUM_TOP2;
    }
    if (text == "sum")
    {
        return DepartmentScore::kSUM;
    }
    fail("field 'department_score' must be 'max', 'sum_top2' or 'sum', got '" + text + "'");
}

char const* activationName(Activation value)
{
    return value == Activation::kSWIGLU_CLAMPED ? "swiglu_clamped" : "swiglu";
}

Activation parseActivation(std::string const& text)
{
    if (text == "swiglu")
    {
        return Activation::kSWIGLU;
    }
    if (text == "swiglu_clamped")
    {
        return Activation::kSWIGLU_CLAMPED;
    }
    fail("field 'activation' must be 'swiglu' or 'swiglu_clamped', got '" + text + "'");
}

// ---------------------------------------------------------------------------------------
// Free functions of deamoePlugin.h
// ---------------------------------------------------------------------------------------

char const* inputRoleName(InputRole role) noexcept
{
    switch (role)
    {
    case InputRole::kHIDDEN: return "hidden_states";
    case InputRole::kROUTER_WEIGHT: return "router.weight";
    case InputRole::kROUTER_BIAS: return "router.bias";
    case InputRole::kDEPARTMENT_GATE_UP: return "departments.gate_up";
    case InputRole::kDEPARTMENT_DOWN: return "departments.down";
    case InputRole::kEXPERT_GATE_UP: return "experts.gate_up";
    case InputRole::kEXPERT_DOWN: return "experts.down";
    case InputRole::kSHARED_GATE_UP: return "shared_experts.gate_up";
    case InputRole::kSHARED_DOWN: return "shared_experts.down";
    case InputRole::kSHARED_GATE: return "shared_experts.gate";
    case InputRole::kDEPARTMENT_GATE_UP_SCALES: return "departments.gate_up.scales";
    case InputRole::kDEPARTMENT_DOWN_SCALES: return "departments.down.scales";
    case InputRole::kEXPERT_GATE_UP_SCALES: return "experts.gate_up.scales";
    case InputRole::kEXPERT_DOWN_SCALES: return "experts.down.scales";
    case InputRole::kSHARED_GATE_UP_SCALES: return "shared_experts.gate_up.scales";
    case InputRole::kSHARED_DOWN_SCALES: return "shared_experts.down.scales";
    case InputRole::kROUTER_LOGIT_BIAS: return "router.logit_bias";
    case InputRole::kDEPARTMENT_GATE_UP_BIAS: return "departments.gate_up_bias";
    case InputRole::kEXPERT_GATE_UP_BIAS: return "experts.gate_up_bias";
    case InputRole::kEXPERT_DOWN_BIAS: return "experts.down_bias";
    case InputRole::kSHARED_GATE_UP_BIAS: return "shared_experts.gate_up_bias";
    case InputRole::kSHARED_DOWN_BIAS: return "shared_experts.down_bias";
    }
    return "unknown";
}

std::vector<InputRole> presentInputs(LayerParams const& p)
{
    std::vector<InputRole> roles{InputRole::kHIDDEN, InputRole::kROUTER_WEIGHT};
    if (p.hasRouterBias)
    {
        roles.push_back(InputRole::kROUTER_BIAS);
    }
    if (p.sharedWidth > 0)
    {
        roles.push_back(InputRole::kDEPARTMENT_GATE_UP);
        roles.push_back(InputRole::kDEPARTMENT_DOWN);
    }
    if (p.privateWidth > 0)
    {
        roles.push_back(InputRole::kEXPERT_GATE_UP);
        roles.push_back(InputRole::kEXPERT_DOWN);
    }
    if (p.sharedExpertWidth > 0)
    {
        roles.push_back(InputRole::kSHARED_GATE_UP);
        roles.push_back(InputRole::kSHARED_DOWN);
    }
    if (p.sharedExpertGate)
    {
        roles.push_back(InputRole::kSHARED_GATE);
    }
    if (p.sharedWidth > 0 && p.weightBits > 0)
    {
        roles.push_back(InputRole::kDEPARTMENT_GATE_UP_SCALES);
        roles.push_back(InputRole::kDEPARTMENT_DOWN_SCALES);
    }
    if (p.privateWidth > 0 && p.weightBits > 0)
    {
        roles.push_back(InputRole::kEXPERT_GATE_UP_SCALES);
        roles.push_back(InputRole::kEXPERT_DOWN_SCALES);
    }
    if (p.sharedExpertWidth > 0 && p.weightBits > 0)
    {
        roles.push_back(InputRole::kSHARED_GATE_UP_SCALES);
        roles.push_back(InputRole::kSHARED_DOWN_SCALES);
    }
    if (p.hasRouterLogitBias)
    {
        roles.push_back(InputRole::kROUTER_LOGIT_BIAS);
    }
    if (p.sharedWidth > 0 && p.ffnBias)
    {
        roles.push_back(InputRole::kDEPARTMENT_GATE_UP_BIAS);
    }
    if (p.privateWidth > 0 && p.ffnBias)
    {
        roles.push_back(InputRole::kEXPERT_GATE_UP_BIAS);
        roles.push_back(InputRole::kEXPERT_DOWN_BIAS);
    }
    if (p.sharedExpertWidth > 0 && p.ffnBias)
    {
        roles.push_back(InputRole::kSHARED_GATE_UP_BIAS);
        roles.push_back(InputRole::kSHARED_DOWN_BIAS);
    }
    return roles;
}

namespace
{
// The FFN weights, which a quantized node carries as packed codes.
bool carriesCodes(InputRole role) noexcept
{
    switch (role)
    {
    case InputRole::kDEPARTMENT_GATE_UP:
    case InputRole::kDEPARTMENT_DOWN:
    case InputRole::kEXPERT_GATE_UP:
    case InputRole::kEXPERT_DOWN:
    case InputRole::kSHARED_GATE_UP:
    case InputRole::kSHARED_DOWN: return true;
    default: return false;
    }
}
} // namespace

std::vector<int64_t> logicalShape(LayerParams const& p, InputRole role)
{
    int64_t const d = p.hidden;
    int64_t const D = p.numDepartments;
    int64_t const N = static_cast<int64_t>(p.numDepartments) * p.expertsPerDepartment;
    // Scales are present only when quantized, where checkQuantization made G a divisor of
    // every width; 1 keeps a float layer's (unused) answer finite.
    int64_t const G = p.weightGroupSize > 0 ? p.weightGroupSize : 1;
    switch (role)
    {
    case InputRole::kHIDDEN: return {-1, d};
    case InputRole::kROUTER_WEIGHT: return {N, d};
    case InputRole::kROUTER_BIAS: return {N};
    case InputRole::kDEPARTMENT_GATE_UP: return {D, 2 * int64_t{p.sharedWidth}, d};
    case InputRole::kDEPARTMENT_DOWN: return {D, d, p.sharedWidth};
    case InputRole::kEXPERT_GATE_UP: return {N, 2 * int64_t{p.privateWidth}, d};
    case InputRole::kEXPERT_DOWN: return {N, d, p.privateWidth};
    case InputRole::kSHARED_GATE_UP: return {2 * int64_t{p.sharedExpertWidth}, d};
    case InputRole::kSHARED_DOWN: return {d, p.sharedExpertWidth};
    case InputRole::kSHARED_GATE: return {1, d};
    case InputRole::kDEPARTMENT_GATE_UP_SCALES: return {D, 2 * int64_t{p.sharedWidth}, d / G};
    case InputRole::kDEPARTMENT_DOWN_SCALES: return {D, d, p.sharedWidth / G};
    case InputRole::kEXPERT_GATE_UP_SCALES: return {N, 2 * int64_t{p.privateWidth}, d / G};
    case InputRole::kEXPERT_DOWN_SCALES: return {N, d, p.privateWidth / G};
    case InputRole::kSHARED_GATE_UP_SCALES: return {2 * int64_t{p.sharedExpertWidth}, d / G};
    case InputRole::kSHARED_DOWN_SCALES: return {d, p.sharedExpertWidth / G};
    case InputRole::kROUTER_LOGIT_BIAS: return {N};
    case InputRole::kDEPARTMENT_GATE_UP_BIAS: return {D, 2 * int64_t{p.sharedWidth}};
    case InputRole::kEXPERT_GATE_UP_BIAS: return {N, 2 * int64_t{p.privateWidth}};
    case InputRole::kEXPERT_DOWN_BIAS: return {N, d};
    case InputRole::kSHARED_GATE_UP_BIAS: return {2 * int64_t{p.sharedExpertWidth}};
    case InputRole::kSHARED_DOWN_BIAS: return {d};
    }
    return {};
}

std::vector<int64_t> expectedShape(LayerParams const& p, InputRole role)
{
    std::vector<int64_t> shape = logicalShape(p, role);
    if (p.weightBits > 0 && carriesCodes(role))
    {
        shape.back() = shape.back() * p.weightBits / kCODE_WORD_BITS;
    }
    return shape;
}

InputType inputType(LayerParams const& p, InputRole role) noexcept
{
    // The router keeps its own precision (spec, "Router precision").
    if (role == InputRole::kROUTER_BIAS || role == InputRole::kROUTER_LOGIT_BIAS)
    {
        return InputType::kFLOAT32;
    }
    if (role == InputRole::kROUTER_WEIGHT)
    {
        return InputType::kFLOAT32_OR_ACTIVATION;
    }
    return p.weightBits > 0 && carriesCodes(role) ? InputType::kCODES : InputType::kACTIVATION;
}

void checkQuantization(LayerParams const& p)
{
    if (p.weightBits == 0)
    {
        if (p.weightGroupSize != 0)
        {
            fail("field 'weight_group_size' is " + std::to_string(p.weightGroupSize)
                + " but weight_bits is 0 (float weights); it must be 0");
        }
        return;
    }
    if (p.weightBits != 4 && p.weightBits != 8)
    {
        fail("field 'weight_bits' must be 0 (float weights), 4 or 8, got " + std::to_string(p.weightBits));
    }
    int32_t const G = p.weightGroupSize;
    if (G != 16 && G != 32 && G != 64 && G != 128)
    {
        fail("field 'weight_group_size' must be 16, 32, 64 or 128 when weight_bits is " + std::to_string(p.weightBits)
            + ", got " + std::to_string(G));
    }
    // Every quantized weight's input columns are cut into whole groups.
    struct Width
    {
        char const* name;
        int32_t value;
    };
    for (Width const& width : {Width{"hidden_size", p.hidden}, Width{"shared_intermediate_size", p.sharedWidth},
             Width{"private_intermediate_size", p.privateWidth},
             Width{"shared_expert_intermediate_size", p.sharedExpertWidth}})
    {
        if (width.value > 0 && width.value % G != 0)
        {
            fail(std::string("field '") + width.name + "' is " + std::to_string(width.value)
                + ", not divisible by weight_group_size " + std::to_string(G));
        }
    }
}

LayerParams paramsFromFields(PluginFieldCollection const& fc)
{
    if (fc.nbFields > 0 && fc.fields == nullptr)
    {
        fail("the field collection has no fields array");
    }
    LayerParams p{};
    // DeaMoEConfig's defaults for the optional fields.
    p.scoreFunc = ScoreFunc::kSOFTMAX;
    p.departmentScore = DepartmentScore::kMAX;
    p.normTopkProb = 1;
    p.routedScalingFactor = 1.0F;
    p.hasRouterBias = 0;
    p.sharedExpertWidth = 0;
    p.sharedExpertGate = 0;
    p.ffnBias = 0;
    p.activation = Activation::kSWIGLU;
    p.swigluAlpha = 1.702F;
    p.swigluLimit = 7.0F;
    p.hasRouterLogitBias = 0;
    p.weightBits = 0;
    p.weightGroupSize = 0;

    std::set<std::string> seen;
    for (int32_t i = 0; i < fc.nbFields; ++i)
    {
        PluginField const& field = fc.fields[i];
        std::string const name = field.name ? field.name : "";
        bool ignored = false;
        for (char const* skip : kIGNORED_FIELDS)
        {
            ignored = ignored || name == skip;
        }
        if (ignored)
        {
            continue;
        }
        if (!seen.insert(name).second)
        {
            fail("field '" + name + "' is given twice");
        }
        if (name == "hidden_size")
            p.hidden = readInt32(field);
        else if (name == "num_departments")
            p.numDepartments = readInt32(field);
        else if (name == "experts_per_department")
            p.expertsPerDepartment = readInt32(field);
        else if (name == "shared_intermediate_size")
            p.sharedWidth = readInt32(field);
        else if (name == "private_intermediate_size")
            p.privateWidth = readInt32(field);
        else if (name == "top_k")
            p.topK = readInt32(field);
        else if (name == "top_departments")
            p.topDepartments = readInt32(field);
        else if (name == "score_func")
            p.scoreFunc = parseScoreFunc(readString(field));
        else if (name == "department_score")
            p.departmentScore = parseDepartmentScore(readString(field));
        else if (name == "norm_topk_prob")
            p.normTopkProb = readBool(field);
        else if (name == "routed_scaling_factor")
            p.routedScalingFactor = readFloat(field);
        else if (name == "router_bias")
            p.hasRouterBias = readBool(field);
        else if (name == "shared_expert_intermediate_size")
            p.sharedExpertWidth = readInt32(field);
        else if (name == "shared_expert_gate")
            p.sharedExpertGate = readBool(field);
        else if (name == "ffn_bias")
            p.ffnBias = readBool(field);
        else if (name == "activation")
            p.activation = parseActivation(readString(field));
        else if (name == "swiglu_alpha")
            p.swigluAlpha = readFloat(field);
        else if (name == "swiglu_limit")
            p.swigluLimit = readFloat(field);
        else if (name == "router_logit_bias")
            p.hasRouterLogitBias = readBool(field);
        else if (name == "weight_bits")
            p.weightBits = readInt32(field);
        else if (name == "weight_group_size")
            p.weightGroupSize = readInt32(field);
        else
        {
            // Strict on purpose: a misspelt optional field would otherwise silently take its default.
            std::string known;
            for (FieldSpec const& spec : kFIELDS)
            {
                known += (known.empty() ? "" : ", ") + std::string(spec.name);
            }
            fail("unknown field '" + name + "'; known: " + known);
        }
    }
    for (FieldSpec const& spec : kFIELDS)
    {
        if (spec.required && seen.count(spec.name) == 0)
        {
            fail(std::string("missing field '") + spec.name
                + "' (a DeaMoE node needs every required DeaMoEConfig attribute)");
        }
    }
    return p;
}

std::string describe(LayerParams const& p)
{
    std::ostringstream out;
    out << "d=" << p.hidden << " D=" << p.numDepartments << " m=" << p.expertsPerDepartment << " f_s=" << p.sharedWidth
        << " f_p=" << p.privateWidth << " k=" << p.topK << " g=" << p.topDepartments
        << " score_func=" << scoreFuncName(p.scoreFunc)
        << " department_score=" << departmentScoreName(p.departmentScore) << " norm_topk_prob=" << p.normTopkProb
        << " routed_scaling_factor=" << p.routedScalingFactor << " router_bias=" << p.hasRouterBias
        << " f_sh=" << p.sharedExpertWidth << " shared_expert_gate=" << p.sharedExpertGate << " ffn_bias=" << p.ffnBias
        << " activation=" << activationName(p.activation) << " swiglu_alpha=" << p.swigluAlpha
        << " swiglu_limit=" << p.swigluLimit << " router_logit_bias=" << p.hasRouterLogitBias
        << " weight_bits=" << p.weightBits << " weight_group_size=" << p.weightGroupSize;
    return out.str();
}

} // namespace plugin
} // namespace deamoe
