"""The quantize stage: activation-aware int4/int8 weights for layers and stacks (awq) and for
language models (lm). The quantized format itself is deamoe_trt.quant."""
