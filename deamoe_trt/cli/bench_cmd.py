"""`deamoe-trt bench`: DeaMoE vs its expanded twin vs ONNX Runtime's vanilla MoE on this CPU.

Times every contender in one process, interleaved step by step, on fresh random inputs,
and reports medians, weights loaded per step, the roof (bytes / measured read bandwidth)
and speedups; --json keeps every figure, --plot draws them. See docs/benchmarks.md."""

from __future__ import annotations

import argparse

from . import args as common

_layer_count = common.int_at_least(0, "a layer count >= 0 or 'auto'")


def _layers(text: str):
    return "auto" if text == "auto" else _layer_count(text)


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def register(subparsers) -> None:
    from ..presets import PRESETS

    parser = subparsers.add_parser(
        "bench",
        help="time DeaMoE against its expanded twin and ONNX Runtime's vanilla MoE on this CPU",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--preset",
        choices=list(PRESETS),
        default=None,
        help="layer shape (default qwen3-30b-a3b-layer; tiny with --quick)",
    )
    parser.add_argument(
        "--tokens",
        type=common.token_counts,
        default=None,
        metavar="N,N,...",
        help="tokens per decoding step to try (default 1,2,4,8; 1,3 with --quick)",
    )
    common.add_dtype(parser, choices=("fp32", "fp16"))
    parser.add_argument(
        "--steps", type=common.positive_int, default=None, help="timed steps per token count (default 200)"
    )
    parser.add_argument(
        "--warmup", type=common.non_negative_int, default=None, help="untimed steps first (default max(3, steps/10))"
    )
    parser.add_argument("--json", metavar="PATH", type=common.writable_path, help="write every figure as JSON here")
    parser.add_argument("--plot", metavar="PATH", type=common.writable_path, help="write the figure (PNG) here")
    parser.add_argument("--quick", action="store_true", help="a small run in seconds (tiny preset, few steps)")
    parser.add_argument(
        "--layers",
        type=_layers,
        default=None,
        metavar="N|auto",
        help="multi-layer section: layers in the stack, 'auto' (as many as fit comfortably, the default) or 0 (off)",
    )
    parser.add_argument(
        "--stack-dtype", choices=("fp16", "fp32"), default="fp16", help="dtype of the multi-layer stack (default fp16)"
    )
    parser.add_argument(
        "--threads", type=common.thread_count, default=None, help="threads per runtime (default: all cores)"
    )
    parser.add_argument(
        "--only",
        type=_names,
        default=None,
        metavar="NAME,...",
        help="run only these contenders, e.g. deamoe/cpu,vanilla/ort",
    )
    parser.add_argument(
        "--gap-ms",
        type=common.number("a number of milliseconds in [0, 10000]", lambda v: 0 <= v <= 10000),
        default=None,
        help="busy pause before each timed call, longer after runtimes whose threads spin (default 2; 0 with --quick)",
    )
    parser.add_argument(
        "--ort-spinning",
        choices=("on", "off"),
        default=None,
        help="let ONNX Runtime's threads spin between runs (its own default; off here: see docs/benchmarks.md)",
    )
    parser.add_argument(
        "--memory-fraction",
        type=common.number("a number in (0, 1]", lambda v: 0 < v <= 1),
        default=None,
        metavar="F",
        help="share of available memory the run may plan for (default 0.8); contenders beyond it are skipped",
    )
    parser.add_argument(
        "--quantized",
        type=int,
        choices=(4, 8),
        default=None,
        metavar="BITS",
        help="instead: int4/int8 DeaMoE on the CPU kernel vs its quantized twin, ONNX Runtime's QMoE vanilla "
        "layer and fp32/fp16 DeaMoE (default 1 token; see docs/benchmarks.md)",
    )
    parser.add_argument(
        "--group-size", type=int, default=None, help="with --quantized: columns per scale (default 128; 16 --quick)"
    )
    common.add_seed(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..bench import BenchOptions, format_result, run_bench, write_json, write_plot
    from ..bench.plot import pyplot

    if args.plot:
        pyplot()  # before minutes of benchmarking, not after them
    if args.quantized is not None:
        return run_quantized(args)
    if args.group_size is not None:
        from ..errors import UsageError

        raise UsageError("--group-size goes with --quantized")

    changes = {
        "dtype": args.dtype,
        "seed": args.seed,
        "threads": args.threads,
        "stack_dtype": args.stack_dtype,
        "only": args.only,
    }
    if args.ort_spinning is not None:
        changes["ort_spinning"] = args.ort_spinning == "on"
    for name in ("preset", "tokens", "steps", "warmup", "layers"):
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    if args.gap_ms is not None:
        changes["gap_ms"] = args.gap_ms
    if args.memory_fraction is not None:
        changes["memory_fraction"] = args.memory_fraction
    options = BenchOptions.quick_run(**changes) if args.quick else BenchOptions(**changes)
    result = run_bench(options)
    print(format_result(result))
    if args.json:
        print(f"\nwrote {write_json(result, args.json)}")
    if args.plot:
        print(f"wrote {write_plot(result, args.plot)}")
    return 0


def run_quantized(args) -> int:
    from ..bench import write_json
    from ..bench.quantized import QuantBenchOptions, format_quant_result, run_quant_bench

    changes = {"bits": args.quantized, "seed": args.seed, "threads": args.threads}
    for name in ("preset", "tokens", "steps", "warmup", "group_size", "gap_ms"):
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    options = QuantBenchOptions.quick_run(**changes) if args.quick else QuantBenchOptions(**changes)
    result = run_quant_bench(options)
    print(format_quant_result(result))
    if args.json:
        print(f"\nwrote {write_json(result, args.json)}")
    return 0
