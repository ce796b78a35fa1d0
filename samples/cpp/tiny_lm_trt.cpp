// A decode loop on the TensorRT runtime: prompt in, text out, time per output token (TPOT).
//
// Runs an engine built from the plugin-form export of a deamoe-trt language model
// (deamoe_trt/lm/onnx_export.py) with its two optimisation profiles (deamoe_trt/lm/trt.py):
//   profile 0, prefill: input_ids [1, 1..C], past_key_values.* [1, kv_heads, 0, head_dim]
//   profile 1, decode:  input_ids [1, 1],    past_key_values.* [1, kv_heads, 1..C-1, head_dim]
// Outputs: logits [1, T, vocab] float32, present.{i}.key/value [1, kv_heads, past + T, head_dim].
//
// The DeaMoE plugin library is loaded first (it registers its creator when loaded; the
// "dynamic" variant is handed to the registry instead). Tokens are bytes (id = byte value);
// the prompt may hold newline and printable ASCII, as the shipped tiny-lm was trained on.
// Decoding is greedy (argmax, ties to the lower id), batch 1. Each layer's KV cache lives
// in two device buffers of the largest size: a step reads past from one and writes present
// to the other, then they swap. Everything the model's sizes need is read from the engine.
//
// Usage: tiny_lm_trt --engine tiny-lm-deamoe.engine --plugin libdeamoe_plugin.so
//                    [--prompt "Anne Elliot was"] [--max-new-tokens 120]

#include <NvInfer.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

namespace
{

constexpr int kPrefill = 0;
constexpr int kDecode = 1;

// Exit codes as the deamoe-trt command line: 2 for input the user can fix, 1 for a failed run.
[[noreturn]] void fail(std::string const& message, int code = 1)
{
    std::cerr << "tiny_lm_trt: error: " << message << "\n";
    std::exit(code);
}

void checkCuda(cudaError_t status, char const* what)
{
    if (status != cudaSuccess)
    {
        fail(std::string(what) + ": " + cudaGetErrorString(status));
    }
}

class Logger : public nvinfer1::ILogger
{
public:
    void log(Severity severity, nvinfer1::AsciiChar const* msg) noexcept override
    {
        if (severity <= Severity::kWARNING)
        {
            std::cerr << "[TensorRT] " << msg << "\n";
        }
    }
};

struct Args
{
    std::string engine;
    std::string plugin;
    std::string prompt = "Anne Elliot was";
    int maxNewTokens = 120;
};

Args parseArgs(int argc, char** argv)
{
    Args args;
    for (int i = 1; i < argc; ++i)
    {
        std::string const flag = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc)
            {
                fail(flag + " needs a value", 2);
            }
            return argv[++i];
        };
        if (flag == "--engine")
            args.engine = value();
        else if (flag == "--plugin")
            args.plugin = value();
        else if (flag == "--prompt")
            args.prompt = value();
        else if (flag == "--max-new-tokens")
        {
            std::string const text = value();
            char* end = nullptr;
            long const n = std::strtol(text.c_str(), &end, 10);
            if (*end != '\0' || n < 1 || n > 1000000)
                fail("--max-new-tokens must be an integer >= 1, got '" + text + "'", 2);
            args.maxNewTokens = static_cast<int>(n);
        }
        else if (flag == "-h" || flag == "--help")
        {
            std::cout << "usage: tiny_lm_trt --engine ENGINE --plugin LIBRARY [--prompt TEXT] [--max-new-tokens N]\n";
            std::exit(0);
        }
        else
            fail("unknown argument '" + flag + "' (see --help)", 2);
    }
    if (args.engine.empty())
        fail("--engine is required (an engine built by samples/python/generate_trt.py or deamoe_trt.lm.trt)", 2);
    return args;
}

// Byte tokenizer: id = byte value. Rejects what the tiny model never saw, naming it.
std::vector<int64_t> encode(std::string const& text)
{
    if (text.empty())
        fail("the prompt is empty; give at least one character", 2);
    std::vector<int64_t> ids;
    for (size_t i = 0; i < text.size(); ++i)
    {
        auto const byte = static_cast<unsigned char>(text[i]);
        if (byte != '\n' && (byte < 0x20 || byte > 0x7E))
        {
            char hex[8];
            std::snprintf(hex, sizeof(hex), "0x%02X", byte);
            fail("the prompt has byte " + std::string(hex) + " at byte " + std::to_string(i + 1)
                    + ", which the tiny-lm tokenizer does not know; it knows newline and printable ASCII",
                2);
        }
        ids.push_back(byte);
    }
    return ids;
}

std::string decode(std::vector<int64_t> const& ids)
{
    std::string text;
    for (int64_t id : ids)
        text += (id >= 0 && id < 256) ? static_cast<char>(id) : '?';
    return text;
}

void loadPlugin(std::string const& path)
{
    auto* registry = getPluginRegistry();
    if (registry->getCreator("DeaMoE", "1", "") != nullptr)
        return; // already registered
    if (path.empty())
        fail("--plugin is required: the engine's DeaMoE layers need the plugin library (build it from plugins/)", 2);
    // RTLD_GLOBAL so the kernels' symbols stay resolvable; the library registers its creator.
    if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr)
        fail("cannot load the plugin library " + path + ": " + dlerror(), 2);
    if (registry->getCreator("DeaMoE", "1", "") == nullptr)
        registry->loadLibrary(path.c_str()); // the "dynamic" variant registers through the registry
    if (registry->getCreator("DeaMoE", "1", "") == nullptr)
        fail(path + " registered no DeaMoE v1 plugin creator (built against another TensorRT?)");
}

size_t elementSize(nvinfer1::DataType type)
{
    switch (type)
    {
    case nvinfer1::DataType::kFLOAT: return 4;
    case nvinfer1::DataType::kHALF: return 2;
    case nvinfer1::DataType::kBF16: return 2;
    default: fail("the engine's KV cache has an unsupported data type");
    }
}

struct DeviceBuffer
{
    void* ptr = nullptr;
    explicit DeviceBuffer(size_t bytes) { checkCuda(cudaMalloc(&ptr, std::max<size_t>(bytes, 1)), "cudaMalloc"); }
    ~DeviceBuffer() { cudaFree(ptr); }
    DeviceBuffer(DeviceBuffer const&) = delete;
    DeviceBuffer& operator=(DeviceBuffer const&) = delete;
};

// The model's sizes, as the engine's tensors say them.
struct Sizes
{
    int layers = 0;
    int kvHeads = 0;
    int headDim = 0;
    int vocab = 0;
    int context = 0; // C: the prefill profile's largest input_ids length
    nvinfer1::DataType cacheType = nvinfer1::DataType::kFLOAT;
};

std::string pastName(int layer, int kv)
{
    return "past_key_values." + std::to_string(layer) + (kv == 0 ? ".key" : ".value");
}

std::string presentName(int layer, int kv)
{
    return "present." + std::to_string(layer) + (kv == 0 ? ".key" : ".value");
}

Sizes readSizes(nvinfer1::ICudaEngine const& engine)
{
    Sizes s;
    for (int i = 0; i < engine.getNbIOTensors(); ++i)
    {
        std::string const name = engine.getIOTensorName(i);
        if (name.rfind("past_key_values.", 0) == 0 && name.size() > 4 && name.compare(name.size() - 4, 4, ".key") == 0)
            ++s.layers;
    }
    if (s.layers == 0 || engine.getNbOptimizationProfiles() != 2)
        fail("the engine is not a deamoe-trt language model with prefill and decode profiles", 2);
    nvinfer1::Dims const past = engine.getTensorShape(pastName(0, 0).c_str());
    nvinfer1::Dims const logits = engine.getTensorShape("logits");
    s.kvHeads = static_cast<int>(past.d[1]);
    s.headDim = static_cast<int>(past.d[3]);
    s.vocab = static_cast<int>(logits.d[2]);
    s.context
        = static_cast<int>(engine.getProfileShape("input_ids", kPrefill, nvinfer1::OptProfileSelector::kMAX).d[1]);
    s.cacheType = engine.getTensorDataType(pastName(0, 0).c_str());
    return s;
}

class Decoder
{
public:
    Decoder(nvinfer1::ICudaEngine& engine, Sizes const& sizes)
        : mSizes(sizes)
        , mIds(sizeof(int64_t) * sizes.context)
        , mLogits(sizeof(float) * static_cast<size_t>(sizes.context) * sizes.vocab)
        , mHostLogits(sizes.vocab)
    {
        checkCuda(cudaStreamCreate(&mStream), "cudaStreamCreate");
        for (int profile : {kPrefill, kDecode})
        {
            mContexts.emplace_back(engine.createExecutionContext());
            if (!mContexts.back() || !mContexts.back()->setOptimizationProfileAsync(profile, mStream))
                fail("cannot create an execution context for profile " + std::to_string(profile));
        }
        size_t const cacheBytes = elementSize(sizes.cacheType) * sizes.kvHeads * sizes.context * sizes.headDim;
        for (auto& set : mCache)
            for (int i = 0; i < 2 * sizes.layers; ++i)
                set.emplace_back(std::make_unique<DeviceBuffer>(cacheBytes));
    }

    ~Decoder() { cudaStreamDestroy(mStream); }

    // Feeds ids after the cached ones; returns the greedy next token.
    int64_t run(std::vector<int64_t> const& ids, int profile)
    {
        auto& context = *mContexts[profile];
        int const tokens = static_cast<int>(ids.size());
        checkCuda(cudaMemcpyAsync(mIds.ptr, ids.data(), sizeof(int64_t) * tokens, cudaMemcpyHostToDevice, mStream),
            "copy input_ids");
        context.setInputShape("input_ids", nvinfer1::Dims2{1, tokens});
        context.setTensorAddress("input_ids", mIds.ptr);
        auto& reads = mCache[mCurrent];
        auto& writes = mCache[1 - mCurrent];
        for (int layer = 0; layer < mSizes.layers; ++layer)
        {
            for (int kv = 0; kv < 2; ++kv)
            {
                std::string const past = pastName(layer, kv);
                context.setInputShape(past.c_str(), nvinfer1::Dims4{1, mSizes.kvHeads, mLength, mSizes.headDim});
                context.setTensorAddress(past.c_str(), reads[2 * layer + kv]->ptr);
                context.setTensorAddress(presentName(layer, kv).c_str(), writes[2 * layer + kv]->ptr);
            }
        }
        context.setTensorAddress("logits", mLogits.ptr);
        if (!context.enqueueV3(mStream))
            fail("TensorRT execution failed (see its messages above)");
        auto const* last
            = static_cast<char const*>(mLogits.ptr) + sizeof(float) * static_cast<size_t>(tokens - 1) * mSizes.vocab;
        checkCuda(
            cudaMemcpyAsync(mHostLogits.data(), last, sizeof(float) * mSizes.vocab, cudaMemcpyDeviceToHost, mStream),
            "copy logits");
        checkCuda(cudaStreamSynchronize(mStream), "cudaStreamSynchronize");
        mCurrent = 1 - mCurrent;
        mLength += tokens;
        return std::max_element(mHostLogits.begin(), mHostLogits.end()) - mHostLogits.begin();
    }

    int length() const { return mLength; }

    // Forget the cache: the next run is a prefill again.
    void reset()
    {
        mCurrent = 0;
        mLength = 0;
    }

private:
    Sizes mSizes;
    cudaStream_t mStream{};
    std::vector<std::unique_ptr<nvinfer1::IExecutionContext>> mContexts;
    DeviceBuffer mIds;
    DeviceBuffer mLogits;
    std::vector<float> mHostLogits;
    std::vector<std::unique_ptr<DeviceBuffer>> mCache[2];
    int mCurrent = 0;
    int mLength = 0;
};

double millisecondsSince(std::chrono::steady_clock::time_point start)
{
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

} // namespace

int main(int argc, char** argv)
{
    Args const args = parseArgs(argc, argv);
    std::vector<int64_t> const prompt = encode(args.prompt);

    Logger logger;
    loadPlugin(args.plugin);
    std::ifstream file(args.engine, std::ios::binary);
    if (!file)
        fail("no engine file at " + args.engine, 2);
    std::vector<char> const blob((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    std::unique_ptr<nvinfer1::IRuntime> runtime(nvinfer1::createInferRuntime(logger));
    std::unique_ptr<nvinfer1::ICudaEngine> engine(runtime->deserializeCudaEngine(blob.data(), blob.size()));
    if (!engine)
        fail(
            args.engine + " is not an engine this TensorRT (" + std::to_string(getInferLibVersion()) + ") can load", 2);
    Sizes const sizes = readSizes(*engine);
    if (static_cast<int>(prompt.size()) >= sizes.context)
        fail("the prompt is " + std::to_string(prompt.size()) + " tokens but the model's context holds "
                + std::to_string(sizes.context) + " and needs room for one new token",
            2);
    int const budget = std::min(args.maxNewTokens, sizes.context - static_cast<int>(prompt.size()));

    Decoder decoder(*engine, sizes);
    // Warm-up (prefill and two steps, untimed): first-run allocations and kernel loading stay out of TPOT.
    int64_t token = decoder.run(prompt, kPrefill);
    for (int i = 0; i < 2 && decoder.length() < sizes.context; ++i)
        token = decoder.run({token}, kDecode);
    decoder.reset();

    auto start = std::chrono::steady_clock::now();
    std::vector<int64_t> generated{decoder.run(prompt, kPrefill)};
    double const ttft = millisecondsSince(start);
    std::vector<double> steps;
    while (static_cast<int>(generated.size()) < budget)
    {
        start = std::chrono::steady_clock::now();
        generated.push_back(decoder.run({generated.back()}, kDecode));
        steps.push_back(millisecondsSince(start));
    }

    std::cout << args.prompt << decode(generated) << "\n\n";
    double const tpot = steps.empty() ? 0.0 : std::accumulate(steps.begin(), steps.end(), 0.0) / steps.size();
    std::printf("runtime    layers  prompt tokens  new tokens  TTFT ms  TPOT ms  tokens/s\n");
    std::printf("---------  ------  -------------  ----------  -------  -------  --------\n");
    std::printf("tensorrt   %6d  %13zu  %10zu  %7.3f  %7.3f  %8.1f\n", sizes.layers, prompt.size(), generated.size(),
        ttft, tpot, tpot > 0 ? 1000.0 / tpot : 0.0);
    if (budget < args.maxNewTokens)
        std::printf("(stopped after %d tokens: the context of %d is full)\n", budget, sizes.context);
    return 0;
}
