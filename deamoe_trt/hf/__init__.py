"""DeaMoE language models as Hugging Face transformers models.

- configuration: DeaMoEPretrainedConfig, config.json's Hugging Face keys plus the whole LMConfig
  under "deamoe_lm" (model_type "deamoe");
- modeling: DeaMoEForCausalLM, the reference model (deamoe_trt.lm.model.DeaMoELM) behind
  transformers' PreTrainedModel and GenerationMixin, decoding with transformers' caches;
- remote_code: the modules a saved directory carries so that
  `from_pretrained(dir, trust_remote_code=True)` works with only transformers and torch;
- directory: the files of a model directory besides its weights (config.json, tokenizer,
  generation config), for export-hf and export-vllm;
- registration: AutoConfig / AutoModelForCausalLM registration once transformers loads.

Importing this package imports no transformers; its submodules configuration and modeling do.
"""
