"""What both Python samples share: finding the shipped model, running a decoder, printing results."""

from __future__ import annotations

import sys

from deamoe_trt.lm.shipped import TINY_LM

DEFAULT_MODEL = TINY_LM  # package data: there in a wheel as in a checkout
DEFAULT_PROMPT = "Anne Elliot was"
TWINS = ("deamoe", "expanded")


def run_twins(make_decoder, loaded, prompt: str, max_new_tokens: int, runtime: str) -> int:
    """Decode prompt with each twin's decoder, print the texts and the TPOT table; check against PyTorch."""
    from deamoe_trt import runtimes
    from deamoe_trt.runtimes.decode import generate, timing_table, warm_up

    tokenizer = loaded.tokenizer
    prompt_ids = tokenizer.encode(prompt)
    reference = generate(runtimes.get("torch").decoder(loaded.model), prompt_ids, max_new_tokens).new_ids
    results = []
    for twin in TWINS:
        decoder = make_decoder(twin)
        warm_up(decoder, prompt_ids)
        result = generate(decoder, prompt_ids, max_new_tokens, model=twin)
        results.append(result)
        same = "same tokens as PyTorch greedy" if result.new_ids == reference else "DIFFERS from PyTorch greedy"
        print(f"--- {twin} on {runtime} ({same})")
        print(prompt + tokenizer.decode(result.new_ids))
        print()
    print(timing_table(results, title=f"Time per output token on {runtime} (greedy, batch 1)"))
    deamoe, expanded = (r.tpot_s for r in results)
    if deamoe and expanded:
        print(f"expanded twin TPOT / DeaMoE TPOT: {expanded / deamoe:.2f}x")
    return 0 if all(r.new_ids == reference for r in results) else 1


def main_guard(prog: str, body) -> int:
    """Run body(); deamoe-trt's errors become one line on stderr and their exit code."""
    from deamoe_trt.errors import DeaMoEError

    try:
        return body()
    except DeaMoEError as exc:
        print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return exc.exit_code
