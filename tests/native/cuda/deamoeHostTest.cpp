/*
 * Test-only host entry points: the device's routing and plan logic (deamoeRouting.cuh,
 * deamoePlan.cuh) compiled for the CPU, so tests/native/cuda/ can check it against
 * deamoe_trt/routing.py without a GPU. Not part of the kernel library.
 *
 * Build: c++ -std=c++17 -O2 -ffp-contract=off -shared -fPIC -Inative/cuda deamoeHostTest.cpp -o libdeamoe_host_test.so
 * (the pytest session fixture in tests/conftest.py does this).
 */
#include <vector>

#include "deamoePlan.cuh"
#include "deamoeRouting.cuh"

using deamoe::detail::FloatBias;
using deamoe::detail::PlanConfig;
using deamoe::detail::PlanEntry;
using deamoe::detail::PlanView;
using deamoe::detail::RoutingConfig;
using deamoe::detail::SerialLanes;

namespace
{

bool validRouting(RoutingConfig const& c)
{
    return c.numDepartments >= 1 && c.expertsPerDepartment >= 1
        && c.numExperts == c.numDepartments * c.expertsPerDepartment && c.topDepartments >= 1
        && c.topDepartments <= c.numDepartments && c.topK >= 1 && c.topK <= c.topDepartments * c.expertsPerDepartment
        && (c.departmentScore != 1 || c.expertsPerDepartment >= 2);
}

} // namespace

extern "C"
{

int32_t deamoe_host_max_tile_tokens()
{
    return deamoe::detail::kMaxTileTokens;
}

// Routing of numTokens tokens from float32 logits [T, N]; bias [N] or null.
// Returns 0, or 1 for an invalid config / argument.
int32_t deamoe_host_route_logits(RoutingConfig const* cfg, float const* logits, float const* bias, int32_t numTokens,
    int32_t* expertIds, float* weights, int32_t* departmentIds, int32_t* keptDepartments)
{
    if (!cfg || !validRouting(*cfg) || numTokens < 0 || (numTokens > 0 && !logits))
        return 1;
    RoutingConfig const& c = *cfg;
    std::vector<float> scratch(deamoe::detail::routingScratchFloats(c));
    for (int t = 0; t < numTokens; ++t)
    {
        deamoe::detail::routeToken(SerialLanes{}, c, logits + static_cast<size_t>(t) * c.numExperts, FloatBias{bias},
            scratch.data(), expertIds + t * c.topK, weights + t * c.topK, departmentIds + t * c.topK,
            keptDepartments + t * c.topDepartments);
    }
    return 0;
}

// Router logits z = x W^T (x [T, d], W [N, d], float32), accumulated in double, then
// routed: the host form of deamoe::route(). logits [T, N] is an output too.
int32_t deamoe_host_route(RoutingConfig const* cfg, int32_t hidden, float const* x, float const* routerWeight,
    float const* bias, int32_t numTokens, float* logits, int32_t* expertIds, float* weights, int32_t* departmentIds,
    int32_t* keptDepartments)
{
    if (!cfg || hidden < 1 || numTokens < 0)
        return 1;
    int const N = cfg->numExperts;
    for (int t = 0; t < numTokens; ++t)
    {
        for (int n = 0; n < N; ++n)
        {
            double acc = 0.0;
            for (int i = 0; i < hidden; ++i)
                acc += static_cast<double>(x[static_cast<size_t>(t) * hidden + i])
                    * routerWeight[static_cast<size_t>(n) * hidden + i];
            logits[static_cast<size_t>(t) * N + n] = static_cast<float>(acc);
        }
    }
    return deamoe_host_route_logits(cfg, logits, bias, numTokens, expertIds, weights, departmentIds, keptDepartments);
}

// The plan of one tile (numTokens <= deamoe_host_max_tile_tokens()) from its routing.
// Capacities: departments/departmentEntryCounts [D], experts/expertEntryCounts [N],
// entries [capacity][max_tile_tokens], departmentSlots [T].
int32_t deamoe_host_plan(PlanConfig const* cfg, int32_t numTokens, int32_t const* expertIds, float const* weights,
    int32_t const* keptDepartments, int32_t* counts, int32_t* departments, int32_t* experts,
    int32_t* departmentEntryCounts, int32_t* expertEntryCounts, PlanEntry* departmentEntries, PlanEntry* expertEntries,
    int32_t* departmentSlots)
{
    if (!cfg || numTokens < 0 || numTokens > deamoe::detail::kMaxTileTokens)
        return 1;
    std::vector<uint32_t> scratch(deamoe::detail::planScratchWords(*cfg));
    PlanView const view{counts, departments, experts, departmentEntryCounts, expertEntryCounts, departmentEntries,
        expertEntries, departmentSlots};
    deamoe::detail::buildPlan(
        SerialLanes{}, SerialLanes{}, true, *cfg, numTokens, expertIds, weights, keptDepartments, scratch.data(), view);
    return 0;
}

} // extern "C"
