"""`deamoe-trt bench`: DeaMoE vs its expanded twin vs ONNX Runtime's vanilla MoE on this CPU.

A layer (the default): times every contender in one process, interleaved step by step, on
fresh random inputs, and reports medians, weights loaded per step, the roof (bytes /
measured read bandwidth) and speedups; --json keeps every figure, --plot draws them.

--lm: a whole language model's time per output token, DeaMoE vs its expanded and vanilla
twins (deamoe_trt/bench/lm_bench.py: the model and the method). The three twins of one
runtime are resident at once; runtimes run in turn. Configurations estimated above
--max-memory-gb are refused before anything is built. --llama-bench PATH adds llama.cpp
(llama-bench, with llama-quantize and llama-perplexity beside it; scripts/build_llama_cpp.sh
builds them) on the vanilla twin as GGUF f16, Q8_0 and Q4_0, and every contender's held-out
perplexity. --sequences 1,4,16 times batched decoding instead: each twin on one runtime's
batch decoder (--runtimes cpu-native, the default: the native step; cuda: the whole model on
a CUDA GPU; cuda-emulated: the same under the SIMT emulator, slow, for checks) at each count
of sequences (aggregate tokens/s, the time of a batched step, bytes per step, % of the roof
measured in the same run: the CPU read bandwidth, or on cuda a device-to-device copy's; none
emulated), and with --llama-bench (cpu-native), llama.cpp's llama-batched-bench on the
vanilla twin as GGUF f16 and the type matching --quantized, at the same counts.

A flag of the other form is refused in one line. `bench-lm` is an alias of `bench --lm`,
kept for one release. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import args as common

_layer_count = common.int_at_least(0, "a layer count >= 0 or 'auto'")


def _layers(text: str):
    return "auto" if text == "auto" else _layer_count(text)


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


# The flags (argparse dests) only one form takes; every one defaults to None (or False).
LAYER_ONLY = (
    "preset",
    "tokens",
    "dtype",
    "warmup",
    "quick",
    "stack_dtype",
    "only",
    "gap_ms",
    "ort_spinning",
    "memory_fraction",
)
LM_ONLY = (
    "departments",
    "sequences",
    "runtimes",
    "max_memory_gb",
    "linears",
    "attention",
    "llama_bench",
    "llama_tokens",
    "gguf_dir",
)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="time DeaMoE against its expanded twin and ONNX Runtime's vanilla MoE on this CPU (--lm: a whole LM)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_flags(parser)
    alias_help = "alias of bench --lm, kept for one release"
    alias = subparsers.add_parser(
        "bench-lm",
        help=alias_help,
        description="Alias of `deamoe-trt bench --lm`, kept for one release.\n\n" + __doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_flags(alias)
    alias.set_defaults(lm=True)


def _add_flags(parser) -> None:
    from ..presets import PRESETS
    from ..quant import BITS, GROUP_SIZES

    parser.add_argument(
        "--lm", action="store_true", help="time a whole language model (time per output token) instead of a layer"
    )
    parser.add_argument(
        "--layers",
        type=_layers,
        default=None,
        metavar="N|auto",
        help="a layer: layers in the multi-layer section, 'auto' (as many as fit comfortably, the default) or 0 "
        "(off); --lm: decoder blocks (default 2)",
    )
    parser.add_argument(
        "--steps",
        type=common.positive_int,
        default=None,
        help="timed steps per token count (default 200); --lm: decode steps per contender, in interleaved bursts "
        "(default 32)",
    )
    parser.add_argument(
        "--threads", type=common.thread_count, default=None, help="threads per runtime (default: all cores; --lm: 2)"
    )
    parser.add_argument(
        "--quantized",
        type=int,
        choices=BITS,
        default=None,
        metavar="BITS",
        help="a layer: int4/int8 DeaMoE on the CPU kernel vs its quantized twin, ONNX Runtime's QMoE vanilla "
        "layer and fp32/fp16 DeaMoE (default 1 token); --lm: int4 or int8 DeaMoE FFN weights",
    )
    parser.add_argument(
        "--group-size",
        type=int,
        choices=GROUP_SIZES,
        default=None,
        help="with --quantized: columns per scale (default 128, 16 with --quick; --lm: 64)",
    )
    parser.add_argument(
        "--seed", type=common.seed_value, default=None, help="seed for weights and random inputs (default 0)"
    )
    parser.add_argument("--json", metavar="PATH", type=common.writable_path, help="write every figure as JSON here")
    parser.add_argument("--plot", metavar="PATH", type=common.writable_path, help="write the figure (PNG) here")
    layer = parser.add_argument_group("a layer")
    layer.add_argument(
        "--preset", choices=list(PRESETS), default=None, help="layer shape (default qwen3-30b-a3b-layer; tiny --quick)"
    )
    layer.add_argument(
        "--tokens",
        type=common.token_counts,
        default=None,
        metavar="N,N,...",
        help="tokens per decoding step to try (default 1,2,4,8; 1,3 with --quick)",
    )
    layer.add_argument("--dtype", choices=("fp32", "fp16"), default=None, help="weights and activations (default fp32)")
    layer.add_argument(
        "--warmup", type=common.non_negative_int, default=None, help="untimed steps first (default max(3, steps/10))"
    )
    layer.add_argument("--quick", action="store_true", help="a small run in seconds (tiny preset, few steps)")
    layer.add_argument(
        "--stack-dtype", choices=("fp16", "fp32"), default=None, help="dtype of the multi-layer stack (default fp16)"
    )
    layer.add_argument(
        "--only",
        type=_names,
        default=None,
        metavar="NAME,...",
        help="run only these contenders, e.g. deamoe/cpu,vanilla/ort",
    )
    layer.add_argument(
        "--gap-ms",
        type=common.number("a number of milliseconds in [0, 10000]", lambda v: 0 <= v <= 10000),
        default=None,
        help="busy pause before each timed call, longer after runtimes whose threads spin (default 2; 0 with --quick)",
    )
    layer.add_argument(
        "--ort-spinning",
        choices=("on", "off"),
        default=None,
        help="let ONNX Runtime's threads spin between runs (its own default; off here: see docs/benchmarks.md)",
    )
    layer.add_argument(
        "--memory-fraction",
        type=common.number("a number in (0, 1]", lambda v: 0 < v <= 1),
        default=None,
        metavar="F",
        help="share of available memory the run may plan for (default 0.8); contenders beyond it are skipped",
    )
    lm = parser.add_argument_group("a language model (--lm)")
    lm.add_argument(
        "--departments", type=common.positive_int, default=None, help="departments of 8 experts per block (default 4)"
    )
    lm.add_argument(
        "--sequences",
        type=common.int_list(1, "sequence counts", "1,4,16"),
        default=None,
        metavar="N[,N]",
        help="time batched decoding at these counts of sequences (e.g. 1,4,16; --runtimes cpu-native, cuda or "
        "cuda-emulated)",
    )
    lm.add_argument(
        "--runtimes",
        default=None,
        help="comma-separated: cpu (the CPU kernel's FFNs, PyTorch attention), cpu-native (the whole step in "
        "native code), ort (default all three); with --sequences one of cpu-native (default), cuda, cuda-emulated",
    )
    lm.add_argument(
        "--max-memory-gb",
        type=common.gigabytes,
        default=None,
        help="refuse configurations estimated above this (default 8)",
    )
    lm.add_argument(
        "--linears",
        default=None,
        metavar="PARTS",
        help="with --quantized: these projections too, comma-separated: attention, head",
    )
    lm.add_argument(
        "--attention",
        choices=("gqa", "mla"),
        default=None,
        help="gqa: Qwen3-30B-A3B's attention (default); mla: DeepSeek-V2-Lite's latent attention",
    )
    lm.add_argument(
        "--llama-bench",
        type=Path,
        default=None,
        metavar="PATH",
        help="a llama-bench binary: time llama.cpp on the vanilla twin as GGUF f16, Q8_0 and Q4_0",
    )
    lm.add_argument(
        "--llama-tokens", type=common.positive_int, default=None, help="decode steps per llama-bench call (default 64)"
    )
    lm.add_argument(
        "--gguf-dir", type=Path, default=None, help="with --llama-bench: keep the GGUF files here (default: a temp dir)"
    )
    parser.set_defaults(func=run)


def refuse_other_form(args) -> None:
    """A one-line UsageError for the first flag given that the chosen form (layer or --lm) does not take."""
    from ..errors import UsageError

    other, form = (LAYER_ONLY, "a language model (--lm)") if args.lm else (LM_ONLY, "a layer (no --lm)")
    for name in other:
        if getattr(args, name) not in (None, False):
            raise UsageError(f"--{name.replace('_', '-')} does not apply to bench of {form}; drop it")
    if args.lm and args.layers in ("auto", 0):
        raise UsageError(f"--layers is a count of decoder blocks >= 1 with --lm, got {args.layers}")


def run(args) -> int:
    from dataclasses import fields

    from ..bench.run import BenchRequest, run_requested

    refuse_other_form(args)
    return run_requested(BenchRequest(**{f.name: getattr(args, f.name) for f in fields(BenchRequest)}))
