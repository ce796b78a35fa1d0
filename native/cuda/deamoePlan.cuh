/*
 * The plan of one step tile (up to kMaxTileTokens tokens), host and device: which
 * departments and experts the tile uses, and for each of them the tokens that use it.
 *
 * The grouped SwiGLU kernels walk the plan, so every used weight row is read once per
 * tile however many tokens or experts use it:
 * - a department part is used when at least one of the tile's kept experts lies in it
 *   (a department kept in stage 1 that received no expert is not in the plan);
 *   its entry for token t carries W_j = sum of t's weights over its kept experts in j,
 *   summed in t's selection order;
 * - an expert part is used when some token kept it; its entry carries w_e.
 * Parts are listed in ascending id order, entries in ascending token order: the same
 * sets torch.unique gives over the reference routing.
 *
 * Every entry also names a "slot" of its token, where the part's intermediate activation
 * and output partial live: for an expert, its position in the token's expertIds row
 * (0..k-1); for a department, its rank among the token's departments that hold experts,
 * in the token's stage-1 order (0..departmentSlots[t]-1).
 */
#pragma once

#include "deamoeCommon.cuh"

namespace deamoe
{
namespace detail
{

struct PlanEntry
{
    int32_t token; // token index within the tile
    int32_t slot;  // see above
    float weight;  // W_j (department) or w_e (expert)
};

struct PlanConfig
{
    int32_t numExperts;           // N
    int32_t numDepartments;       // D
    int32_t expertsPerDepartment; // m
    int32_t topK;                 // k
    int32_t topDepartments;       // g
};

// Where buildPlan writes. Capacities: maxDepartmentParts >= min(D, T*min(g,k)),
// maxExpertParts >= min(N, T*k); entries are [part][kMaxTileTokens].
struct PlanView
{
    int32_t* counts;                // [2]: used departments U_d, used experts U_e
    int32_t* departments;           // [maxDepartmentParts], ascending
    int32_t* experts;               // [maxExpertParts], ascending
    int32_t* departmentEntryCounts; // [maxDepartmentParts]
    int32_t* expertEntryCounts;     // [maxExpertParts]
    PlanEntry* departmentEntries;   // [maxDepartmentParts][kMaxTileTokens]
    PlanEntry* expertEntries;       // [maxExpertParts][kMaxTileTokens]
    int32_t* departmentSlots;       // [numTokens]: departments of the token that hold experts
};

// Worst-case plan sizes for a tile of `tokens` tokens.
DEAMOE_HD int maxDepartmentParts(PlanConfig const& cfg, int tokens)
{
    int const perToken = cfg.topDepartments < cfg.topK ? cfg.topDepartments : cfg.topK;
    int const most = tokens * perToken;
    return most < cfg.numDepartments ? most : cfg.numDepartments;
}

DEAMOE_HD int maxExpertParts(PlanConfig const& cfg, int tokens)
{
    int const most = tokens * cfg.topK;
    return most < cfg.numExperts ? most : cfg.numExperts;
}

// Scratch the caller provides: N + D uint32 words (shared memory on the device).
DEAMOE_HD int planScratchWords(PlanConfig const& cfg)
{
    return cfg.numExperts + cfg.numDepartments;
}

// Writes the indices i < n with masks[i] != 0, ascending, to out; returns how many.
// Ballot compaction: one pass of n/width steps.
template <class Warp>
DEAMOE_HD int compactNonzero(Warp const& warp, uint32_t const* masks, int n, int32_t* out)
{
    int count = 0;
    for (int base = 0; base < n; base += warp.width())
    {
        int const i = base + warp.lane();
        bool const used = i < n && masks[i] != 0u;
        uint32_t const votes = warp.ballot(used);
        if (used)
            out[count + popcount32(votes & warp.lowerLanesMask())] = i;
        count += popcount32(votes);
    }
    return count;
}

// Builds the plan of numTokens (<= kMaxTileTokens) routed tokens.
// expertIds/weights are [numTokens][k], keptDepartments [numTokens][g] (routeToken's outputs).
// `block` are all cooperating threads; `warp` is the first warp of them (only used when
// inFirstWarp); both must be entered by every thread of `block`. On the host pass
// SerialLanes for both and inFirstWarp = true.
template <class Block, class Warp>
DEAMOE_HD void buildPlan(Block const& block, Warp const& warp, bool inFirstWarp, PlanConfig const& cfg, int numTokens,
    int32_t const* expertIds, float const* weights, int32_t const* keptDepartments, uint32_t* scratch,
    PlanView const& plan)
{
    int const N = cfg.numExperts;
    int const D = cfg.numDepartments;
    int const m = cfg.expertsPerDepartment;
    int const k = cfg.topK;
    int const g = cfg.topDepartments;
    int const lane = block.lane();
    int const width = block.width();
    uint32_t* expertTokens = scratch;         // [N] token bit sets
    uint32_t* departmentTokens = scratch + N; // [D]

    for (int i = lane; i < N + D; i += width)
        scratch[i] = 0u;
    block.sync();
    for (int i = lane; i < numTokens * k; i += width)
    {
        uint32_t const bit = 1u << (i / k);
        int const e = expertIds[i];
        block.atomicOrU32(expertTokens + e, bit); // OR is order-free: deterministic
        block.atomicOrU32(departmentTokens + e / m, bit);
    }
    block.sync();

    if (inFirstWarp)
    {
        int const usedDepartments = compactNonzero(warp, departmentTokens, D, plan.departments);
        int const usedExperts = compactNonzero(warp, expertTokens, N, plan.experts);
        if (warp.lane() == 0)
        {
            plan.counts[0] = usedDepartments;
            plan.counts[1] = usedExperts;
        }
    }
    block.sync();
    int const usedDepartments = plan.counts[0];
    int const usedExperts = plan.counts[1];

    // Expert entries: one lane per used expert.
    for (int p = lane; p < usedExperts; p += width)
    {
        int const e = plan.experts[p];
        uint32_t tokens = expertTokens[e];
        PlanEntry* entries = plan.expertEntries + p * kMaxTileTokens;
        int n = 0;
        while (tokens)
        {
            int const t = lowestBit(tokens);
            tokens &= tokens - 1u;
            int slot = 0;
            while (expertIds[t * k + slot] != e)
                ++slot;
            entries[n++] = PlanEntry{t, slot, weights[t * k + slot]};
        }
        plan.expertEntryCounts[p] = n;
    }

    // Department entries: one lane per used department.
    for (int p = lane; p < usedDepartments; p += width)
    {
        int const j = plan.departments[p];
        uint32_t tokens = departmentTokens[j];
        PlanEntry* entries = plan.departmentEntries + p * kMaxTileTokens;
        int n = 0;
        while (tokens)
        {
            int const t = lowestBit(tokens);
            tokens &= tokens - 1u;
            float weight = 0.0f;
            for (int s = 0; s < k; ++s)
            {
                if (expertIds[t * k + s] / m == j)
                    weight += weights[t * k + s];
            }
            // Rank of j among t's departments that hold experts, in stage-1 order.
            int slot = 0;
            for (int a = 0; a < g; ++a)
            {
                int const other = keptDepartments[t * g + a];
                if (other == j)
                    break;
                slot += static_cast<int>((departmentTokens[other] >> t) & 1u);
            }
            entries[n++] = PlanEntry{t, slot, weight};
        }
        plan.departmentEntryCounts[p] = n;
    }

    for (int t = lane; t < numTokens; t += width)
    {
        int slots = 0;
        for (int a = 0; a < g; ++a)
            slots += static_cast<int>((departmentTokens[keptDepartments[t * g + a]] >> t) & 1u);
        plan.departmentSlots[t] = slots;
    }
    block.sync();
}

} // namespace detail
} // namespace deamoe
