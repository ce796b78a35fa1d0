/*
 * The DeaMoE node's attributes as PluginFields: the field table (names, kinds, which are
 * required), the names of the enum-valued attributes, and LayerParams in messages. The
 * parsing itself (paramsFromFields) and the node's inputs are declared in deamoePlugin.h.
 */
#pragma once

#include "deamoePlugin.h"

#include <NvInferRuntime.h>

#include <string>

namespace deamoe
{
namespace plugin
{

// ---------------------------------------------------------------------------------------
// Fields: one per DeaMoEConfig field, then the quantization's two (weight_bits,
// weight_group_size; 0 for float weights), named as the ONNX node's attributes.
// ---------------------------------------------------------------------------------------

enum class FieldKind
{
    kINT,
    kBOOL,
    kFLOAT,
    kSTRING,
};

struct FieldSpec
{
    char const* name;
    FieldKind kind;
    bool required;
};

// Order = the attribute table of README.md. Optional fields default as DeaMoEConfig does.
constexpr FieldSpec kFIELDS[] = {
    {"hidden_size", FieldKind::kINT, true},
    {"num_departments", FieldKind::kINT, true},
    {"experts_per_department", FieldKind::kINT, true},
    {"shared_intermediate_size", FieldKind::kINT, true},
    {"private_intermediate_size", FieldKind::kINT, true},
    {"top_k", FieldKind::kINT, true},
    {"top_departments", FieldKind::kINT, true},
    {"score_func", FieldKind::kSTRING, false},
    {"department_score", FieldKind::kSTRING, false},
    {"norm_topk_prob", FieldKind::kBOOL, false},
    {"routed_scaling_factor", FieldKind::kFLOAT, false},
    {"router_bias", FieldKind::kBOOL, false},
    {"shared_expert_intermediate_size", FieldKind::kINT, false},
    {"shared_expert_gate", FieldKind::kBOOL, false},
    {"ffn_bias", FieldKind::kBOOL, false},
    {"activation", FieldKind::kSTRING, false},
    {"swiglu_alpha", FieldKind::kFLOAT, false},
    {"swiglu_limit", FieldKind::kFLOAT, false},
    {"router_logit_bias", FieldKind::kBOOL, false},
    {"weight_bits", FieldKind::kINT, false},
    {"weight_group_size", FieldKind::kINT, false},
};

// Node attributes that select the plugin rather than configure it. The ONNX parser never
// passes them (it only passes getFieldNames()), but a Python caller copying a node's
// attributes might.
constexpr char const* kIGNORED_FIELDS[] = {"plugin_version", "plugin_namespace"};

nvinfer1::PluginFieldType pluginFieldType(FieldKind kind);

char const* scoreFuncName(ScoreFunc value);
char const* departmentScoreName(DepartmentScore value);
ScoreFunc parseScoreFunc(std::string const& text);
DepartmentScore parseDepartmentScore(std::string const& text);
char const* activationName(Activation value);
Activation parseActivation(std::string const& text);

} // namespace plugin
} // namespace deamoe
