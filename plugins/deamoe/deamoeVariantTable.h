/*
 * The per-GPU kernel variant tables (deamoe_trt/cuda/tuning.py holds their definition: file
 * name, shape key, choice of a token tile) read by the plugin, so that an engine runs the
 * kernel variant `deamoe-trt check-gpu --tune` measured fastest on this GPU, as the Python
 * bindings do. The folder is DEAMOE_TRT_KERNEL_TABLES (the package's deamoe_trt/cuda/tuned/
 * when deamoe_trt loads the plugin); unset, or no file for this GPU: variant 0.
 */
#pragma once

#include "deamoeKernels.h"

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>

namespace deamoe
{
namespace plugin
{

// The environment variable naming the folder of the tables.
constexpr char const* kVARIANT_TABLES_ENV = "DEAMOE_TRT_KERNEL_TABLES";

// The kernels' token tiles (tuning.TILE_TOKENS).
constexpr std::array<int32_t, 5> kTILE_TOKENS{1, 2, 4, 8, 16};

// "NVIDIA H200" -> "NVIDIA_H200.json" (tuning.device_file_name); "" when the name has no letter
// or digit.
std::string variantTableFileName(std::string const& deviceName);

// "d7168-e8x32-s1536-p512-x2048-k8" (tuning.shape_key).
std::string variantShapeKey(LayerParams const& params);

// "fp32", "fp16", "bf16" (deamoe_trt/dtypes.py's names).
char const* dtypeKey(DataType dtype) noexcept;

// The variant id of a name of this kernel library's (variantName), or 0 for a name it lacks
// (a table written by a library with other variants), as the bindings do.
int32_t variantIdOf(std::string const& name) noexcept;

class VariantTable
{
public:
    // Parses a table's JSON text; throws std::invalid_argument naming `source` and the problem.
    static VariantTable parse(std::string const& text, std::string const& source);

    // The variant id for a case at numTokens: the listed one at its tile, else at the nearest
    // listed tile (in log2, ties to the smaller), else 0 (tuning.VariantTable.variant).
    int32_t variant(std::string const& shape, DataType dtype, int32_t bits, int32_t numTokens) const;

    // The ids for the tiles of kTILE_TOKENS.
    std::array<int32_t, kTILE_TOKENS.size()> tileVariants(std::string const& shape, DataType dtype, int32_t bits) const;

    std::string const& device() const noexcept { return mDevice; }

private:
    using Key = std::tuple<std::string, std::string, int32_t>; // shape, dtype, bits
    std::string mDevice;
    std::map<Key, std::map<int32_t, std::string>> mCases;
};

// The tile index of numTokens (tuning.tile_tokens): 0 for 1 token ... 4 for 9 or more.
size_t tileIndex(int32_t numTokens) noexcept;

// The table of the current CUDA device in folder `dir`: false when there is none (no file);
// throws std::invalid_argument for a file that cannot be read or parsed.
bool loadVariantTable(std::string const& dir, std::string const& deviceName, VariantTable& table);

} // namespace plugin
} // namespace deamoe
