"""DeaMoE language models served by vLLM: a model directory writer, vLLM's model class, its plugin
and the batched benchmark.

- `export`: `deamoe-trt export-vllm` (a Hugging Face-style directory; needs no vLLM);
- `checks`: what the plugin can serve, the vLLM versions it was tested with, attention head sizes;
- `hf_config`: the directory's config.json as a transformers config (checked when vLLM reads it);
- `model`: `DeaMoEForCausalLM`, built on vLLM's attention, paged KV cache and FusedMoE;
- `plugin`: the `vllm.general_plugins` entry point that registers both with vLLM;
- `serve`: `python -m deamoe_trt.integrations.vllm.serve DIR ...`, vLLM's OpenAI server after the checks;
- `bench`: `python -m deamoe_trt.integrations.vllm.bench`, batched throughput and TPOT against the twins.

Nothing here imports vllm at module level except `model`, which only vLLM loads.
"""
