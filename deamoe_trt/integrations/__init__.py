"""Outside engines, one subpackage each, holding everything deamoe-trt does with that engine:
its export, runtime, validation, device check and benchmark.

- `vllm/`: DeaMoE language models on vLLM (the model directory, the model class, the plugin,
  `serve`, the batched benchmark);
- `triton/`: Triton Inference Server (model repositories, the LM decode service and its
  scheduler, a real tritonserver, the load and fault harness of `serve-bench`);
- `edgellm/`: TensorRT Edge-LLM (its model directories, their validation, `check-edgellm`);
- `genai/`: ONNX Runtime GenAI model folders (`export --target genai`);
- `llamacpp/`: the vanilla twin as a GGUF file, and llama.cpp's own tools (llama-bench,
  llama-quantize, llama-perplexity) run on it as `bench-lm --llama-bench`'s contender.

An integration builds on the core, lm/, the kernels (cpu/, cuda/) and the stages; no stage
imports an integration (only cli/ and the entry points do), so what a stage and an
integration share lives in the stage (tests/test_layering.py).
"""
