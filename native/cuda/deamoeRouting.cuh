/*
 * Department-then-expert routing of one token (spec steps 1-5), host and device.
 *
 * This is deamoe_trt/routing.py's route_logits, decision for decision:
 *   s = softmax(z) or sigmoid(z)          (float32)
 *   c = s + b                             (b = 0 without a selection bias)
 *   department score over c: max, sum of the top two, or sum
 *   keep the top g departments            (best first, ties to the lower index)
 *   keep the top k experts by c among the kept departments' experts
 *   w_e = s_e [/ (sum of kept s + 1e-20)] * routed_scaling_factor
 *
 * Exactness notes (why the decisions match the stable sort of the reference):
 * - top-n is n rounds of "argmax, ties to the lower index, then mark the winner taken".
 *   Taken entries are overwritten with NaN, which never wins a comparison. n rounds of
 *   that produce exactly the first n indices of a stable descending sort.
 * - The reference masks non-kept departments with -inf and sorts all N experts. Only
 *   experts of kept departments can be among the first k of that sort (there are
 *   g*m >= k of them and their c is finite), so stage 2 scans just those g*m candidates.
 * - Every c is finite when selection starts (a token with a non-finite one has them all
 *   set to 0, as the reference does), so each round has a winner: every id written is in
 *   range, which the plan (deamoePlan.cuh) relies on to index its token bit sets.
 * - Ties survive: equal logits give bit-equal scores (same function of the same input),
 *   and a department score is a fixed-order function of its experts' c values.
 * Float rounding (exp, the softmax denominator, the `sum` department score, the
 * normalisation sum) may differ from PyTorch's in the last bit; that changes weights by
 * an ulp and a decision only when two candidates are within an ulp of each other.
 */
#pragma once

#include "deamoeCommon.cuh"

namespace deamoe
{
namespace detail
{

// The routing fields of LayerParams as plain ints (the host tests build this file without
// any CUDA header, so it does not use LayerParams itself).
struct RoutingConfig
{
    int32_t numExperts;           // N = D * m
    int32_t numDepartments;       // D
    int32_t expertsPerDepartment; // m
    int32_t topK;                 // k
    int32_t topDepartments;       // g
    int32_t scoreFunc;            // 0 softmax, 1 sigmoid (ScoreFunc)
    int32_t departmentScore;      // 0 max, 1 sum_top2, 2 sum (DepartmentScore)
    int32_t normTopkProb;         // bool
    float routedScalingFactor;
};

// Added to the sum of kept scores before normalising (deamoe_trt.routing.NORM_EPS).
constexpr float kNormEps = 1e-20f;

// Per-token scratch the caller provides (shared memory on the device):
// selection[N] floats, departmentScores[D] floats, kept[g] ints.
DEAMOE_HD int routingScratchFloats(RoutingConfig const& cfg)
{
    return cfg.numExperts + cfg.numDepartments + cfg.topDepartments;
}

// Scores s from logits; softmax needs the row maximum and the denominator.
struct ScoreFn
{
    int32_t sigmoid;
    float rowMax;
    float denominator;

    DEAMOE_HD float operator()(float z) const
    {
        return sigmoid ? 1.0f / (1.0f + expf(-z)) : expf(z - rowMax) / denominator;
    }
};

// The score function of one token's logits[N] (step 1): for softmax, the row maximum and the
// denominator, reduced over all lanes (every lane must call this and gets the same result).
template <class Lanes>
DEAMOE_HD ScoreFn scoreFunction(Lanes const& lanes, RoutingConfig const& cfg, float const* logits)
{
    ScoreFn score{cfg.scoreFunc, 0.0f, 1.0f};
    if (!cfg.scoreFunc)
    {
        float localMax = -INFINITY;
        for (int i = lanes.lane(); i < cfg.numExperts; i += lanes.width())
            localMax = fmaxf(localMax, logits[i]);
        score.rowMax = lanes.reduceMax(localMax);
        float localSum = 0.0f;
        for (int i = lanes.lane(); i < cfg.numExperts; i += lanes.width())
            localSum += expf(logits[i] - score.rowMax);
        score.denominator = lanes.reduceSum(localSum);
    }
    return score;
}

// Routes one token. `lanes` cooperate (a warp on the device, one serial lane on the host);
// every lane must call this. logits[N] float32; bias(i) returns the selection bias of
// expert i as float (0 when there is none). Outputs are written by the leader lane:
// expertIds[k] (best first), weights[k], departmentIds[k], keptDepartments[g].
template <class Lanes, class Bias>
DEAMOE_HD void routeToken(Lanes const& lanes, RoutingConfig const& cfg, float const* logits, Bias const& bias,
    float* scratch, int32_t* expertIds, float* weights, int32_t* departmentIds, int32_t* keptDepartments)
{
    int const N = cfg.numExperts;
    int const D = cfg.numDepartments;
    int const m = cfg.expertsPerDepartment;
    int const k = cfg.topK;
    int const g = cfg.topDepartments;
    int const lane = lanes.lane();
    int const width = lanes.width();

    float* selection = scratch;                                  // [N]
    float* departmentScores = scratch + N;                       // [D]
    int32_t* kept = reinterpret_cast<int32_t*>(scratch + N + D); // [g]

    // Step 1: scores.
    ScoreFn const score = scoreFunction(lanes, cfg, logits);
    // Step 2: selection scores c = s + b.
    float localNonFinite = 0.0f;
    for (int i = lane; i < N; i += width)
    {
        float const c = score(logits[i]) + bias(i);
        selection[i] = c;
        localNonFinite = fmaxf(localNonFinite, isFiniteFloat(c) ? 0.0f : 1.0f);
    }
    // A token with any NaN or infinite c (a NaN in its hidden state, a +inf logit under
    // softmax, arbitrary data while TensorRT times the plugin) chooses as if all its c tied:
    // the lowest-index g departments, then experts 0..k-1 of them (deamoe_trt/routing.py's
    // rule). Without this the selection loops below never find a winner and write INT_MAX
    // ids. Its weights stay what the math gives (NaN under softmax).
    if (lanes.reduceMax(localNonFinite) != 0.0f)
    {
        for (int i = lane; i < N; i += width)
            selection[i] = 0.0f;
    }
    lanes.sync();

    // Step 3a: department scores, each a fixed-order pass over its m experts.
    for (int j = lane; j < D; j += width)
    {
        float const* c = selection + j * m;
        float value;
        if (cfg.departmentScore == 0)
        {
            value = c[0];
            for (int q = 1; q < m; ++q)
                value = fmaxf(value, c[q]);
        }
        else if (cfg.departmentScore == 1)
        {
            // topk(2).values.sum(): a repeated maximum counts twice.
            float first = -INFINITY;
            float second = -INFINITY;
            for (int q = 0; q < m; ++q)
            {
                float v = c[q];
                if (v > first)
                {
                    second = first;
                    first = v;
                }
                else if (v > second)
                {
                    second = v;
                }
            }
            value = first + second;
        }
        else
        {
            value = 0.0f;
            for (int q = 0; q < m; ++q)
                value += c[q];
        }
        departmentScores[j] = value;
    }
    lanes.sync();

    // Step 3b: keep the top g departments.
    for (int r = 0; r < g; ++r)
    {
        float bestValue = -INFINITY;
        int best = INT_MAX;
        for (int j = lane; j < D; j += width)
        {
            if (beats(departmentScores[j], j, bestValue, best))
            {
                bestValue = departmentScores[j];
                best = j;
            }
        }
        lanes.reduceArgmax(bestValue, best);
        if (lanes.leader())
        {
            kept[r] = best;
            departmentScores[best] = NAN; // taken
        }
        lanes.sync();
    }

    // Step 4: top k experts by c among the kept departments' experts.
    for (int r = 0; r < k; ++r)
    {
        float bestValue = -INFINITY;
        int best = INT_MAX;
        for (int a = 0; a < g; ++a)
        {
            int const first = kept[a] * m;
            for (int q = lane; q < m; q += width)
            {
                int const e = first + q;
                if (beats(selection[e], e, bestValue, best))
                {
                    bestValue = selection[e];
                    best = e;
                }
            }
        }
        lanes.reduceArgmax(bestValue, best);
        if (lanes.leader())
        {
            expertIds[r] = best;
            selection[best] = NAN; // taken
        }
        lanes.sync();
    }

    // Step 5: weights from s (not c), in selection order.
    if (lanes.leader())
    {
        float sum = 0.0f;
        for (int r = 0; r < k; ++r)
        {
            int const e = expertIds[r];
            float const s = score(logits[e]);
            weights[r] = s;
            sum += s;
            departmentIds[r] = e / m;
        }
        float const denominator = sum + kNormEps;
        for (int r = 0; r < k; ++r)
        {
            float w = weights[r];
            if (cfg.normTopkProb)
                w = w / denominator;
            weights[r] = w * cfg.routedScalingFactor;
        }
        for (int r = 0; r < g; ++r)
            keptDepartments[r] = kept[r];
    }
    lanes.sync();
}

// Bias accessor for float32 biases (host tests; device callers pass their own for half/bf16).
struct FloatBias
{
    float const* values; // nullptr: no bias
    DEAMOE_HD float operator()(int i) const { return values ? values[i] : 0.0f; }
};

} // namespace detail
} // namespace deamoe
