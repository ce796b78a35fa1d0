/*
 * Host side of the DeaMoE kernels (deamoeForward.cuh): launch geometry and the typed entry
 * points (forwardTyped, routeTyped, ...) that deamoeKernels.cu dispatches to per dtype.
 */
#pragma once

#include "deamoeDownKernel.cuh"
#include "deamoeRouteKernel.cuh"
#include "deamoeRoutedKernel.cuh"
#include "deamoeRouterRowsFloatKernel.cuh"
#include "deamoeRouterSharedKernel.cuh"

namespace deamoe
{
namespace detail
{

// ---------------------------------------------------------------------------------------
// Host side: launch geometry and the typed entry points.

inline int ceilDiv(int a, int b)
{
    return (a + b - 1) / b;
}

#if defined(__CUDACC__)
// Launches kernel<<<grid, block, smem, stream>>>(args), as a programmatic dependent of the
// stream's previous kernel when that is enabled and the GPU is sm_90 or newer. Returns the
// launch's result, for checkLaunch().
template <class Args>
cudaError_t launchKernel(
    void (*kernel)(Args), unsigned grid, unsigned block, size_t smem, cudaStream_t stream, Args const& args)
{
    cudaLaunchAttribute attribute[1];
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(grid);
    config.blockDim = dim3(block);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    if (programmaticLaunchUsable())
    {
        attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attribute[0].val.programmaticStreamSerializationAllowed = 1;
        config.attrs = attribute;
        config.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&config, kernel, args);
}
#endif

// Chunks (16 bytes) of a row of `cols` weights: T values, or BITS-bit codes.
template <class T, int BITS>
int chunksOfRow(int cols)
{
    return BITS > 0 ? cols * BITS / 128 : cols / Elems16<T>::value;
}

inline int log2Exact(int value)
{
    int shift = 0;
    while ((1 << shift) < value)
        ++shift;
    return shift;
}

// The quantized FFN weights of a layer (weightBits > 0), typed for the kernels' arguments.
template <class T>
struct QuantWeights
{
    int groupShift; // log2(weightGroupSize)
    uint8_t const* departmentGateUp;
    T const* departmentGateUpScales;
    uint8_t const* departmentDown;
    T const* departmentDownScales;
    uint8_t const* expertGateUp;
    T const* expertGateUpScales;
    uint8_t const* expertDown;
    T const* expertDownScales;
    uint8_t const* sharedGateUp;
    T const* sharedGateUpScales;
    uint8_t const* sharedDown;
    T const* sharedDownScales;

    QuantWeights() = default;
    QuantWeights(LayerParams const& p, LayerWeights const& w)
        : groupShift(log2Exact(p.weightGroupSize))
        , departmentGateUp(static_cast<uint8_t const*>(w.departmentGateUp))
        , departmentGateUpScales(static_cast<T const*>(w.departmentGateUpScales))
        , departmentDown(static_cast<uint8_t const*>(w.departmentDown))
        , departmentDownScales(static_cast<T const*>(w.departmentDownScales))
        , expertGateUp(static_cast<uint8_t const*>(w.expertGateUp))
        , expertGateUpScales(static_cast<T const*>(w.expertGateUpScales))
        , expertDown(static_cast<uint8_t const*>(w.expertDown))
        , expertDownScales(static_cast<T const*>(w.expertDownScales))
        , sharedGateUp(static_cast<uint8_t const*>(w.sharedGateUp))
        , sharedGateUpScales(static_cast<T const*>(w.sharedGateUpScales))
        , sharedDown(static_cast<uint8_t const*>(w.sharedDown))
        , sharedDownScales(static_cast<T const*>(w.sharedDownScales))
    {
    }
};

inline GluParams gluParams(LayerParams const& p)
{
    return GluParams{p.activation == Activation::kSWIGLU_CLAMPED ? 1 : 0, p.swigluAlpha, p.swigluLimit};
}

template <class T>
struct Geometry
{
    int slices;
    int chunksPerSlice;
    int neuronsPerBlock;

    // A gate/up row of chunksPerRow 16-byte chunks (hidden / Elems16<T> for T weights).
    // wholeRows: one warp per row pair (the staged-gate-up variant: 4 units share the staged x).
    explicit Geometry(int chunksPerRow, bool wholeRows = false)
    {
        // Split a row over more warps when one warp's share would exceed 256 chunks
        // (4 KiB): short per-warp streams keep the tail of each launch short.
        slices = 1;
        while (!wholeRows && slices < kGemvWarps && chunksPerRow > 256 * slices)
            slices *= 2;
        chunksPerSlice = ceilDiv(chunksPerRow, slices);
        neuronsPerBlock = kGemvWarps / slices;
    }
};

// The staged-gate-up variant's window (GateUpArgs::stageColumns): the whole row when TT rows of
// it fit kStagedGateUpBudget, else as many columns as fit, a multiple of 32 chunks of either kind
// of row a block streams (T rows, BITS-bit codes), so that each lane keeps the default's chunks;
// at least 32 chunks (int4 at 16 tokens: 1024 columns, 32 KiB of bf16).
template <class T, int TT, int BITS>
int stagedGateUpColumns(int hidden)
{
    size_t const perColumn = TT * sizeof(T);
    if (static_cast<size_t>(hidden) * perColumn <= kStagedGateUpBudget)
        return hidden;
    int const unit = kWarpSize * std::max(Elems16<T>::value, BITS > 0 ? 128 / BITS : 0);
    int const fit = static_cast<int>(kStagedGateUpBudget / perColumn) / unit * unit;
    return std::min(std::max(fit, unit), hidden);
}

template <class T, int TT, int BITS>
size_t stagedGateUpBytes(int hidden)
{
    return static_cast<size_t>(TT) * static_cast<size_t>(stagedGateUpColumns<T, TT, BITS>(hidden)) * sizeof(T);
}

// K1: router rows in the activation dtype (numExperts of them, 0 for none) and the shared
// experts' gate row (logit column numExperts) and gate/up (BITS > 0: quantized, from quant).
// STAGED: the staged-gate-up variant (the default's kernel where its x would not fit).
template <class T, int TT, int BITS, bool BIT_DEQUANT = false, bool STAGED = false>
Status launchGateUpK1(LayerParams const& p, T const* hidden, T const* routerWeight, float const* logitBias,
    int numExperts, T const* sharedGate, int numTokens, float* logits, int logitsStride, T const* sharedGateUp,
    T const* sharedGateUpBias, float* hShared, int32_t* counters, QuantWeights<T> const& quant, cudaStream_t stream)
{
    size_t const staged = STAGED ? stagedGateUpBytes<T, TT, BITS>(p.hidden) : 0;
    if (staged > kSmemBudget)
        return launchGateUpK1<T, TT, BITS, BIT_DEQUANT, false>(p, hidden, routerWeight, logitBias, numExperts,
            sharedGate, numTokens, logits, logitsStride, sharedGateUp, sharedGateUpBias, hShared, counters, quant,
            stream);
    // The router rows (T) set the slices; quantized shared-expert rows, 1/2 or 1/4 as many
    // chunks, are cut into as many slices (short per-warp streams, the K1 grid stays full).
    Geometry<T> const geo(chunksOfRow<T, 0>(p.hidden), STAGED);
    GateUpArgs<T> args{};
    args.x = hidden;
    args.hidden = p.hidden;
    args.numTokens = numTokens;
    args.slices = geo.slices;
    args.chunksPerSlice = geo.chunksPerSlice;
    args.routedMode = 0;
    args.routerWeight = routerWeight;
    args.numExperts = numExperts;
    args.sharedGateRow = sharedGate;
    args.routerRows = args.numExperts + (sharedGate ? 1 : 0);
    args.logits = logits;
    args.logitsStride = logitsStride;
    args.routerBlocks = ceilDiv(ceilDiv(args.routerRows, 2), geo.neuronsPerBlock);
    args.routerLogitBias = logitBias;
    args.glu = gluParams(p);
    args.sharedGateUpBias = sharedGateUp ? sharedGateUpBias : nullptr;
    args.sharedGateUp = sharedGateUp;
    args.sharedWidth = sharedGateUp ? p.sharedExpertWidth : 0;
    args.hShared = hShared;
    args.counters = counters;
    args.stageColumns = STAGED ? stagedGateUpColumns<T, TT, BITS>(p.hidden) : 0;
    if constexpr (BITS > 0)
    {
        args.sharedGateUp = nullptr;
        args.groupShift = quant.groupShift;
        args.codeChunksPerSlice = ceilDiv(chunksOfRow<T, BITS>(p.hidden), geo.slices);
        args.sharedGateUpCodes = sharedGateUp ? quant.sharedGateUp : nullptr;
        args.sharedGateUpScales = sharedGateUp ? quant.sharedGateUpScales : nullptr;
    }
    int const sharedBlocks = sharedGateUp ? ceilDiv(p.sharedExpertWidth, geo.neuronsPerBlock) : 0;
    // bit-dequant's int8 prmt keeps 2^23's bits in a register: at 16 tokens K1 (4 blocks per SM,
    // 128 registers) spilled it on sm_86/87/89 in bf16, so it converts as the default there.
    constexpr bool kBitDequantK1 = BIT_DEQUANT && !(BITS == 8 && TT == 16);
    return checkLaunch("router/shared gate-up kernel",
        DEAMOE_LAUNCH((routerSharedKernel<T, TT, BITS, kBitDequantK1, STAGED>), args.routerBlocks + sharedBlocks,
            kGemvThreads, staged, stream, args));
}

// K1 (counters: zeroed for K2, or nullptr for route()). A float32 router weight in a
// half-precision layer (spec, "Router precision") has its own kernel first; both zero the
// counters, so they are zero whichever of them runs. routerLogitBias: [N] float32, used
// when p.hasRouterLogitBias; sharedGateUpBias: [2 f_sh] or nullptr.
template <class T, int TT, int BITS = 0, bool BIT_DEQUANT = false, bool STAGED = false>
Status launchRouterLogits(LayerParams const& p, T const* hidden, void const* routerWeight, void const* routerLogitBias,
    T const* sharedGate, int numTokens, float* logits, int logitsStride, T const* sharedGateUp,
    T const* sharedGateUpBias, float* hShared, int32_t* counters, cudaStream_t stream,
    QuantWeights<T> const& quant = QuantWeights<T>{})
{
    int const numExperts = p.numDepartments * p.expertsPerDepartment;
    float const* logitBias = p.hasRouterLogitBias ? static_cast<float const*>(routerLogitBias) : nullptr;
    if (p.routerWeightFloat32 && !std::is_same<T, float>::value)
    {
        // Float32 router rows on their own; K1 below then does only the shared experts'
        // gate row (as logit column N) and gate/up.
        RouterRowsArgs<T> rows{hidden, static_cast<float const*>(routerWeight), p.hidden, numExperts, numTokens, logits,
            logitsStride, counters, logitBias};
        Status const status = checkLaunch("float32 router kernel",
            DEAMOE_LAUNCH(
                (routerRowsFloatKernel<T, TT>), ceilDiv(numExperts, kGemvWarps), kGemvThreads, 0, stream, rows));
        if (status != Status::kSUCCESS || (sharedGate == nullptr && sharedGateUp == nullptr))
            return status;
        return launchGateUpK1<T, TT, BITS, BIT_DEQUANT, STAGED>(p, hidden, nullptr, nullptr, 0, sharedGate, numTokens,
            logits + numExperts, logitsStride, sharedGateUp, sharedGateUpBias, hShared, counters, quant, stream);
    }
    return launchGateUpK1<T, TT, BITS, BIT_DEQUANT, STAGED>(p, hidden, static_cast<T const*>(routerWeight), logitBias,
        numExperts, sharedGate, numTokens, logits, logitsStride, sharedGateUp, sharedGateUpBias, hShared, counters,
        quant, stream);
}

// One tile of the forward; BITS: 0 for T FFN weights, 4 or 8 for quantized ones; BIT_DEQUANT:
// the bit-dequant variant's code conversion in every quantized row loop (BITS > 0).
template <class T, int TT, int BITS, bool BIT_DEQUANT = false>
Status forwardTile(LayerParams const& p, LayerWeights const& w, T const* hidden, T* output, int numTokens,
    WorkspaceLayout const& L, char* ws, int variant, cudaStream_t stream)
{
    int const d = p.hidden;
    int const k = p.topK;
    // staged-gate-up: K1's and K2's gate/up blocks stage x (the default's kernels where it would not fit).
    size_t const stagedGateUp = stagedGateUpBytes<T, TT, BITS>(d);
    bool const stageGateUp = stagesGateUp(variant) && stagedGateUp <= kSmemBudget;
    Geometry<T> const geo(chunksOfRow<T, BITS>(d), stageGateUp); // K2's gate/up rows
    QuantWeights<T> const quant = BITS > 0 ? QuantWeights<T>(p, w) : QuantWeights<T>{};
    float* logits = reinterpret_cast<float*>(ws + L.logits);
    float* hShared = reinterpret_cast<float*>(ws + L.hShared);
    float* sharedOut = p.sharedExpertWidth ? reinterpret_cast<float*>(ws + L.sharedOut) : nullptr;
    int32_t* counters = reinterpret_cast<int32_t*>(ws + L.counters);
    PlanView const plan{reinterpret_cast<int32_t*>(ws + L.counts), reinterpret_cast<int32_t*>(ws + L.departments),
        reinterpret_cast<int32_t*>(ws + L.experts), reinterpret_cast<int32_t*>(ws + L.departmentEntryCounts),
        reinterpret_cast<int32_t*>(ws + L.expertEntryCounts), reinterpret_cast<PlanEntry*>(ws + L.departmentEntries),
        reinterpret_cast<PlanEntry*>(ws + L.expertEntries), reinterpret_cast<int32_t*>(ws + L.departmentSlots)};
    T const* sharedGateUp = p.sharedExpertWidth ? static_cast<T const*>(w.sharedGateUp) : nullptr;
    T const* sharedGate = p.sharedExpertGate ? static_cast<T const*>(w.sharedGate) : nullptr;
    // The FFN biases (p.ffnBias): nullptr when absent, so the kernels add nothing.
    auto const bias = [&p](void const* b) { return p.ffnBias ? static_cast<T const*>(b) : nullptr; };

    // K1
    Status status = stageGateUp ? launchRouterLogits<T, TT, BITS, BIT_DEQUANT, true>(p, hidden, w.routerWeight,
                                      w.routerLogitBias, sharedGate, numTokens, logits, L.logitsStride, sharedGateUp,
                                      bias(w.sharedGateUpBias), hShared, counters, stream, quant)
                                : launchRouterLogits<T, TT, BITS, BIT_DEQUANT>(p, hidden, w.routerWeight,
                                      w.routerLogitBias, sharedGate, numTokens, logits, L.logitsStride, sharedGateUp,
                                      bias(w.sharedGateUpBias), hShared, counters, stream, quant);
    if (status != Status::kSUCCESS)
        return status;

    // K2
    {
        size_t const routingSmem = routedSmemBytes(p);
        if (routingSmem > kSmemBudget)
            return fail(Status::kUNSUPPORTED, "num_experts %d needs more shared memory for routing than %zu bytes",
                p.numDepartments * p.expertsPerDepartment, kSmemBudget);
        size_t const smem = stageGateUp ? std::max(routingSmem, stagedGateUp) : routingSmem;
        RoutedArgs<T> args{};
        args.counters = counters;
        args.routingBlocks = ceilDiv(numTokens, kTokensPerRoutingBlock);
        args.routing = routingConfig(p);
        args.planConfig = planConfig(p);
        args.logits = logits;
        args.logitsStride = L.logitsStride;
        args.routerBias = p.hasRouterBias ? static_cast<float const*>(w.routerBias) : nullptr;
        args.numTokens = numTokens;
        args.expertIds = reinterpret_cast<int32_t*>(ws + L.expertIds);
        args.weights = reinterpret_cast<float*>(ws + L.routingWeights);
        args.departmentIds = reinterpret_cast<int32_t*>(ws + L.departmentIds);
        args.keptDepartments = reinterpret_cast<int32_t*>(ws + L.keptDepartments);
        args.sharedDownBlocks = p.sharedExpertWidth ? L.downTiles : 0;
        args.sharedDown = p.sharedExpertWidth ? static_cast<T const*>(w.sharedDown) : nullptr;
        args.sharedDownBias = p.sharedExpertWidth ? bias(w.sharedDownBias) : nullptr;
        args.hidden = d;
        args.sharedWidth = p.sharedExpertWidth;
        args.hShared = hShared;
        args.sharedGate = p.sharedExpertGate;
        args.sharedOut = sharedOut;
        if constexpr (BITS > 0)
        {
            args.sharedDown = nullptr;
            args.sharedDownCodes = p.sharedExpertWidth ? quant.sharedDown : nullptr;
            args.sharedDownScales = p.sharedExpertWidth ? quant.sharedDownScales : nullptr;
        }

        GateUpArgs<T>& gu = args.gateUp;
        gu.x = hidden;
        gu.hidden = d;
        gu.numTokens = numTokens;
        gu.slices = geo.slices;
        gu.chunksPerSlice = geo.chunksPerSlice;
        gu.routedMode = 1;
        gu.plan = plan;
        gu.departmentGateUp = static_cast<T const*>(w.departmentGateUp);
        gu.departmentWidth = p.sharedWidth;
        gu.hDepartment = reinterpret_cast<float*>(ws + L.hDepartment);
        gu.departmentSlots = L.departmentSlotsPerToken;
        gu.departmentBlocksPerPart = p.sharedWidth ? ceilDiv(p.sharedWidth, geo.neuronsPerBlock) : 0;
        gu.expertGateUp = static_cast<T const*>(w.expertGateUp);
        gu.expertWidth = p.privateWidth;
        gu.hExpert = reinterpret_cast<float*>(ws + L.hExpert);
        gu.topK = k;
        gu.expertBlocksPerPart = p.privateWidth ? ceilDiv(p.privateWidth, geo.neuronsPerBlock) : 0;
        gu.groupShift = quant.groupShift;
        gu.stageColumns = stageGateUp ? stagedGateUpColumns<T, TT, BITS>(d) : 0;
        gu.glu = gluParams(p);
        gu.departmentGateUpBias = p.sharedWidth ? bias(w.departmentGateUpBias) : nullptr;
        gu.expertGateUpBias = p.privateWidth ? bias(w.expertGateUpBias) : nullptr;
        if constexpr (BITS > 0)
        {
            gu.departmentGateUp = nullptr;
            gu.expertGateUp = nullptr;
            gu.codeChunksPerSlice = geo.chunksPerSlice;
            gu.departmentGateUpCodes = quant.departmentGateUp;
            gu.departmentGateUpScales = quant.departmentGateUpScales;
            gu.expertGateUpCodes = quant.expertGateUp;
            gu.expertGateUpScales = quant.expertGateUpScales;
        }
        long long const blocks = args.routingBlocks + args.sharedDownBlocks
            + static_cast<long long>(L.maxDepartmentParts) * gu.departmentBlocksPerPart
            + static_cast<long long>(L.maxExpertParts) * gu.expertBlocksPerPart;
        // One launch of routedKernel<T, TT, BITS, U, BIT_DEQUANT, staged-gate-up>.
        auto const launchRouted = [&](auto unroll, auto staged) {
            return checkLaunch(staged ? "routing/routed gate-up kernel (staged)" : "routing/routed gate-up kernel",
                DEAMOE_LAUNCH(
                    (routedKernel<T, TT, BITS, decltype(unroll)::value, BIT_DEQUANT, decltype(staged)::value>),
                    static_cast<unsigned>(blocks), kGemvThreads, smem, stream, args));
        };
        auto const launchStagedOrNot = [&](auto unroll) {
            return stageGateUp ? launchRouted(unroll, std::true_type{}) : launchRouted(unroll, std::false_type{});
        };
        // deep-loads: float rows at 1-4 tokens (quantized rows measured slower with more in flight).
        if constexpr (BITS == 0 && TT <= 4)
        {
            if (deepLoads(variant))
                status = launchStagedOrNot(std::integral_constant<int, 2 * Unroll<TT>::value>{});
            else
                status = launchStagedOrNot(std::integral_constant<int, Unroll<TT>::value>{});
        }
        else
            status = launchStagedOrNot(std::integral_constant<int, Unroll<TT>::value>{});
        if (status != Status::kSUCCESS)
            return status;
    }

    // K3
    {
        DownArgs<T> args{};
        args.plan = plan;
        args.hidden = d;
        args.numTokens = numTokens;
        args.departmentDown = static_cast<T const*>(w.departmentDown);
        args.departmentWidth = p.sharedWidth;
        args.hDepartment = reinterpret_cast<float const*>(ws + L.hDepartment);
        args.departmentSlots = L.departmentSlotsPerToken;
        args.expertDown = static_cast<T const*>(w.expertDown);
        args.expertDownBias = p.privateWidth ? bias(w.expertDownBias) : nullptr;
        args.expertIds = reinterpret_cast<int32_t const*>(ws + L.expertIds);
        args.routingWeights = reinterpret_cast<float const*>(ws + L.routingWeights);
        args.expertWidth = p.privateWidth;
        args.hExpert = reinterpret_cast<float const*>(ws + L.hExpert);
        args.topK = k;
        args.sharedOut = sharedOut;
        args.output = output;
        args.groupShift = quant.groupShift;
        if constexpr (BITS > 0)
        {
            args.departmentDown = nullptr;
            args.expertDown = nullptr;
            args.departmentDownCodes = quant.departmentDown;
            args.departmentDownScales = quant.departmentDownScales;
            args.expertDownCodes = quant.expertDown;
            args.expertDownScales = quant.expertDownScales;
        }
        size_t const staged = stagedDownSmemBytes<T>(TT, p.sharedWidth, p.privateWidth);
        if (stagesDown(variant) && staged <= kSmemBudget)
            status = checkLaunch("down kernel (staged)",
                DEAMOE_LAUNCH((downKernel<T, TT, BITS, true, BIT_DEQUANT>), static_cast<unsigned>(L.downTiles),
                    kGemvThreads, staged, stream, args));
        else
        {
            // bit-dequant's int8 prmt keeps 2^23's bits in a register: at 1 token the unstaged down
            // kernel (7 blocks per SM, 72 registers) spilled it (sm_90), so it converts as the default.
            constexpr bool kBitDequantDown = BIT_DEQUANT && !(BITS == 8 && TT == 1);
            status = checkLaunch("down kernel",
                DEAMOE_LAUNCH((downKernel<T, TT, BITS, false, kBitDequantDown>), static_cast<unsigned>(L.downTiles),
                    kGemvThreads, 0, stream, args));
        }
    }
    return status;
}

// Token capacity of the kernels for a tile of n tokens: the next power of two.
template <class F>
Status dispatchTileTokens(int n, F&& f)
{
    if (n <= 1)
        return f(std::integral_constant<int, 1>{});
    if (n <= 2)
        return f(std::integral_constant<int, 2>{});
    if (n <= 4)
        return f(std::integral_constant<int, 4>{});
    if (n <= 8)
        return f(std::integral_constant<int, 8>{});
    return f(std::integral_constant<int, 16>{});
}

template <class T>
Status forwardTyped(LayerParams const& p, LayerWeights const& w, void const* hidden, void* output, int32_t numTokens,
    void* workspace, int32_t variant, cudaStream_t stream)
{
    WorkspaceLayout const L = workspaceLayout(p, std::min(numTokens, kMaxTileTokens));
    char* ws = static_cast<char*>(workspace);
    for (int first = 0; first < numTokens; first += kMaxTileTokens)
    {
        int const n = std::min(kMaxTileTokens, numTokens - first);
        T const* x = static_cast<T const*>(hidden) + static_cast<size_t>(first) * p.hidden;
        T* y = static_cast<T*>(output) + static_cast<size_t>(first) * p.hidden;
        Status const status = dispatchTileTokens(n, [&](auto tt) {
            constexpr int TT = decltype(tt)::value;
            // bit-dequant on fp16/bf16 layers, the dtypes a device decodes in; a float32 layer (the
            // reference dtype) runs the default conversion, a third fewer kernels to compile.
            bool const bits = bitDequant(variant) && !std::is_same<T, float>::value;
            switch (p.weightBits) // validated: 0, 4 or 8
            {
            case 4:
                if constexpr (!std::is_same<T, float>::value)
                {
                    if (bits)
                        return forwardTile<T, TT, 4, true>(p, w, x, y, n, L, ws, variant, stream);
                }
                return forwardTile<T, TT, 4>(p, w, x, y, n, L, ws, variant, stream);
            case 8:
                if constexpr (!std::is_same<T, float>::value)
                {
                    if (bits)
                        return forwardTile<T, TT, 8, true>(p, w, x, y, n, L, ws, variant, stream);
                }
                return forwardTile<T, TT, 8>(p, w, x, y, n, L, ws, variant, stream);
            default: return forwardTile<T, TT, 0>(p, w, x, y, n, L, ws, variant, stream);
            }
        });
        if (status != Status::kSUCCESS)
            return status;
    }
    return Status::kSUCCESS;
}

template <class T>
Status launchRoute(LayerParams const& p, float const* logits, int logitsStride, void const* routerBias, int numTokens,
    RoutingOutputs const& out, cudaStream_t stream)
{
    RouteArgs<T> args{};
    args.routing = routingConfig(p);
    args.logits = logits;
    args.logitsStride = logitsStride;
    args.routerBias = p.hasRouterBias ? static_cast<float const*>(routerBias) : nullptr;
    args.numTokens = numTokens;
    args.out = out;
    int const warpsPerBlock = kRouteThreads / kWarpSize;
    size_t const smem = sizeof(float) * routingScratchFloats(args.routing) * warpsPerBlock;
    if (smem > kSmemBudget)
        return fail(Status::kUNSUPPORTED, "num_experts %d needs more shared memory for routing than %zu bytes",
            args.routing.numExperts, kSmemBudget);
    return checkLaunch("routing kernel",
        DEAMOE_LAUNCH((routeKernel<T>), ceilDiv(numTokens, warpsPerBlock), kRouteThreads, smem, stream, args));
}

inline RoutingOutputs offsetOutputs(RoutingOutputs const& out, LayerParams const& p, int first)
{
    return RoutingOutputs{out.expertIds + first * p.topK, out.weights + first * p.topK,
        out.departmentIds + first * p.topK, out.keptDepartments + first * p.topDepartments};
}

template <class T>
Status routeTyped(LayerParams const& p, void const* hidden, void const* routerWeight, void const* routerBias,
    void const* routerLogitBias, int32_t numTokens, RoutingOutputs const& out, void* workspace, cudaStream_t stream)
{
    int const N = p.numDepartments * p.expertsPerDepartment;
    float* logits = static_cast<float*>(workspace);
    for (int first = 0; first < numTokens; first += kMaxTileTokens)
    {
        int const n = std::min(kMaxTileTokens, numTokens - first);
        T const* x = static_cast<T const*>(hidden) + static_cast<size_t>(first) * p.hidden;
        Status status = dispatchTileTokens(n, [&](auto tt) {
            return launchRouterLogits<T, decltype(tt)::value>(
                p, x, routerWeight, routerLogitBias, nullptr, n, logits, N, nullptr, nullptr, nullptr, nullptr, stream);
        });
        if (status == Status::kSUCCESS)
            status = launchRoute<T>(p, logits, N, routerBias, n, offsetOutputs(out, p, first), stream);
        if (status != Status::kSUCCESS)
            return status;
    }
    return Status::kSUCCESS;
}

template <class T>
Status routerLogitsTyped(LayerParams const& p, void const* hidden, void const* routerWeight,
    void const* routerLogitBias, int32_t numTokens, float* logits, cudaStream_t stream)
{
    int const N = p.numDepartments * p.expertsPerDepartment;
    for (int first = 0; first < numTokens; first += kMaxTileTokens)
    {
        int const n = std::min(kMaxTileTokens, numTokens - first);
        T const* x = static_cast<T const*>(hidden) + static_cast<size_t>(first) * p.hidden;
        Status const status = dispatchTileTokens(n, [&](auto tt) {
            return launchRouterLogits<T, decltype(tt)::value>(p, x, routerWeight, routerLogitBias, nullptr, n,
                logits + static_cast<size_t>(first) * N, N, nullptr, nullptr, nullptr, nullptr, stream);
        });
        if (status != Status::kSUCCESS)
            return status;
    }
    return Status::kSUCCESS;
}

template <class T>
Status routeLogitsTyped(LayerParams const& p, float const* logits, void const* routerBias, int32_t numTokens,
    RoutingOutputs const& out, cudaStream_t stream)
{
    int const N = p.numDepartments * p.expertsPerDepartment;
    return launchRoute<T>(p, logits, N, routerBias, numTokens, out, stream);
}

template <class T>
TypedOps const& typedOps()
{
    static TypedOps const ops{&forwardTyped<T>, &routeTyped<T>, &routerLogitsTyped<T>, &routeLogitsTyped<T>};
    return ops;
}

} // namespace detail
} // namespace deamoe
