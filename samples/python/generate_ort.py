#!/usr/bin/env python3
"""Prompt in, text out on ONNX Runtime (CPU): the tiny DeaMoE language model and its expanded twin.

Exports both models (KV cache as inputs/outputs, FFNs in the `ort` form: com.microsoft.MoE),
decodes greedily with the cache, prints the texts, tokens/s and time per output token
(TPOT), and checks the tokens against PyTorch greedy decoding (exit 1 if they differ).

    python samples/python/generate_ort.py --prompt "Anne Elliot was" --max-new-tokens 120
    python samples/python/generate_ort.py --quick        # a few seconds (tests)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULT_MODEL, DEFAULT_PROMPT, main_guard, run_twins


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", default=str(DEFAULT_MODEL), help="language-model checkpoint (default: the shipped tiny-lm)"
    )
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help=f"text to continue (default {DEFAULT_PROMPT!r})")
    parser.add_argument("--max-new-tokens", type=int, default=120, help="tokens to generate (default 120)")
    parser.add_argument("--form", choices=("ort", "onnx"), default="ort", help="DeaMoE FFN form (default ort)")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads (default 1)")
    parser.add_argument("--keep", metavar="DIR", help="write the ONNX models here and keep them (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="16 new tokens: a smoke test in seconds")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.max_new_tokens = min(args.max_new_tokens, 16)

    def body() -> int:
        from deamoe_trt import runtimes
        from deamoe_trt.export.lm import export_lm
        from deamoe_trt.lm.checkpoint import load_lm

        loaded = load_lm(args.model)
        with tempfile.TemporaryDirectory(prefix="deamoe-lm-") as tmp:
            out = Path(args.keep or tmp)

            def make_decoder(twin: str):
                path = export_lm(
                    loaded.model.twin(twin),
                    out / f"tiny-lm-{twin}-{args.form}.onnx",
                    args.form,
                    tokenizer=loaded.tokenizer,
                    twin=twin,
                )
                return runtimes.get("ort").load_decoder(path, threads=args.threads)

            return run_twins(
                make_decoder, loaded, args.prompt, args.max_new_tokens, f"ONNX Runtime CPU ({args.form} form)"
            )

    return main_guard("generate_ort.py", body)


if __name__ == "__main__":
    sys.exit(main())
