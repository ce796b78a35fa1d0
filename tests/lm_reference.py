"""The float model a quantized language model stands for, and the logits a decoder gives on a fixed
prompt: the expectation the quantized-model tests of every runtime compare against; greedy
decoding on a batch decoder, for the tests that compare it with each sequence alone."""

import numpy as np

from deamoe_trt.lm import DeaMoELM
from deamoe_trt.quant import dequantize

IDS = [5, 17, 99, 3, 42, 7]


def dequantized_model(model: DeaMoELM) -> DeaMoELM:
    """The float model a quantized one stands for: each qweight/scales pair (FFNs and projections)
    replaced by dequantize()."""
    quant = model.config.quantization
    state = {}
    for name, tensor in model.state_dict().items():
        if name.endswith(".scales"):
            continue
        if name.endswith(".qweight"):
            base = name.removesuffix(".qweight")
            state[base] = dequantize(tensor, model.state_dict()[base + ".scales"], quant.bits, quant.group_size)
        else:
            state[name] = tensor
    reference = DeaMoELM(model.config.replace(quantization=None, quantized_linears=()), dtype=model.dtype)
    reference.load_state_dict(state)
    return reference.eval()


def logits_of(decoder) -> np.ndarray:
    """Prefill of IDS[:-1] then one decode step: [2, vocab]."""
    return np.stack([decoder.prefill(IDS[:-1]), decoder.step(IDS[-1])])


def greedy_batch(batch, prompts: list[list[int]], steps: int):
    """The prompts opened on a batch decoder and decoded together greedily for `steps` steps:
    their sequences, each one's logits (the prompt's, then one a step) and its tokens."""
    opened = [batch.open(p) for p in prompts]
    seqs = [seq for seq, _ in opened]
    logits = [[first] for _, first in opened]
    tokens: list[list[int]] = [[] for _ in prompts]
    for _ in range(steps):
        for i in range(len(prompts)):
            tokens[i].append(int(logits[i][-1].argmax()))
        rows = batch.step(seqs, [t[-1] for t in tokens])
        assert rows.shape == (len(prompts), logits[0][0].shape[-1]) and rows.dtype == np.float32
        for i, row in enumerate(rows):
            logits[i].append(row)
    return seqs, logits, tokens
