#!/usr/bin/env python3
"""Prompt in, text out on TensorRT: the tiny DeaMoE language model and its expanded twin.

Exports both models in the `plugin` form (one deamoe_trt::DeaMoE node per FFN), builds one
engine each with a prefill and a decode optimisation profile (deamoe_trt.runtimes.tensorrt), decodes
greedily with the KV cache on the GPU, prints the texts, tokens/s and TPOT, and checks the
tokens against PyTorch greedy decoding (exit 1 if they differ). Needs TensorRT 10.3+, a
CUDA GPU with a CUDA build of torch, and the DeaMoE plugin library (plugins/).

    python samples/python/generate_trt.py --plugin build/plugins/libdeamoe_plugin.so
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULT_MODEL, DEFAULT_PROMPT, main_guard, run_twins


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", default=str(DEFAULT_MODEL), help="language-model checkpoint (default: the shipped tiny-lm)"
    )
    parser.add_argument(
        "--plugin", help="DeaMoE plugin library, or 'python' (default: $DEAMOE_TRT_PLUGIN or build/plugins)"
    )
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help=f"text to continue (default {DEFAULT_PROMPT!r})")
    parser.add_argument("--max-new-tokens", type=int, default=120, help="tokens to generate (default 120)")
    parser.add_argument("--workdir", default="build/tiny-lm-trt", help="ONNX models and engines go here (reused)")
    parser.add_argument("--fp16", action="store_true", help="export and build in fp16 (default fp32)")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the engines even if they exist")
    parser.add_argument("--quick", action="store_true", help="16 new tokens")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.max_new_tokens = min(args.max_new_tokens, 16)

    def body() -> int:
        # TensorRT first: without it there is nothing to do, and the message says how to get it.
        from deamoe_trt.trt._tensorrt import import_tensorrt

        trt = import_tensorrt()
        from deamoe_trt import runtimes
        from deamoe_trt.export.lm import export_lm
        from deamoe_trt.lm.checkpoint import load_lm
        from deamoe_trt.trt.lm_engine import build_lm_engine

        loaded = load_lm(args.model)
        workdir = Path(args.workdir)
        dtype = "fp16" if args.fp16 else "fp32"

        def make_decoder(twin: str):
            onnx_path = workdir / f"tiny-lm-{twin}-plugin-{dtype}.onnx"
            engine = workdir / f"tiny-lm-{twin}-{dtype}-trt{trt.__version__}.engine"
            if args.rebuild or not engine.is_file():
                export_lm(loaded.model.twin(twin), onnx_path, "plugin", dtype, tokenizer=loaded.tokenizer, twin=twin)
                print(f"building {engine} ...", file=sys.stderr)
                build_lm_engine(onnx_path, engine, loaded.model.config, plugin=args.plugin)
            return runtimes.get("tensorrt").load_decoder(engine, config=loaded.model.config, plugin=args.plugin)

        return run_twins(
            make_decoder, loaded, args.prompt, args.max_new_tokens, f"TensorRT {trt.__version__} ({dtype})"
        )

    return main_guard("generate_trt.py", body)


if __name__ == "__main__":
    sys.exit(main())
