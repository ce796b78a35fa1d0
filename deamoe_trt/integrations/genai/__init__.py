"""ONNX Runtime GenAI: a language model as a GenAI model folder (`export`: model.onnx,
genai_config.json, tokenizer files; `deamoe-trt export LM --target genai`)."""
