"""`deamoe-trt bench-lm`: whole-model time per output token, DeaMoE vs its expanded and vanilla twins.

See deamoe_trt/bench/lm_bench.py for the model and the method. The three twins of one
runtime are resident at once; runtimes run in turn. Configurations estimated above
--max-memory-gb are refused before anything is built.

--llama-bench PATH adds llama.cpp (llama-bench, with llama-quantize and llama-perplexity
beside it; scripts/build_llama_cpp.sh builds them) on the vanilla twin as GGUF f16, Q8_0
and Q4_0, and every contender's held-out perplexity.

--sequences 1,4,16 times batched decoding instead: each twin on one runtime's batch decoder
(--runtimes cpu-native, the default: the native step; cuda: the whole model on a CUDA GPU;
cuda-emulated: the same under the SIMT emulator, slow, for checks) at each count of sequences
(aggregate tokens/s, the time of a batched step, bytes per step, % of the roof measured in
the same run: the CPU read bandwidth, or on cuda a device-to-device copy's; none emulated),
and with --llama-bench (cpu-native), llama.cpp's llama-batched-bench on the vanilla twin as
GGUF f16 and the type matching --quantized, at the same counts.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import args as common


def register(subparsers) -> None:
    from ..quant import BITS, GROUP_SIZES

    parser = subparsers.add_parser(
        "bench-lm",
        help="whole-model TPOT: a DeaMoE LM vs its expanded and vanilla twins, CPU kernel and ONNX Runtime",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--layers", type=common.positive_int, default=2, help="decoder blocks (default 2)")
    parser.add_argument(
        "--departments", type=common.positive_int, default=4, help="departments of 8 experts per block (default 4)"
    )
    parser.add_argument(
        "--steps",
        type=common.positive_int,
        default=32,
        help="decode steps per contender, in interleaved bursts (default 32)",
    )
    parser.add_argument("--threads", type=common.thread_count, default=2, help="threads per contender (default 2)")
    parser.add_argument(
        "--sequences",
        type=common.int_list(1, "sequence counts", "1,4,16"),
        default=None,
        metavar="N[,N]",
        help="time batched decoding at these counts of sequences (e.g. 1,4,16; --runtimes cpu-native, cuda or "
        "cuda-emulated)",
    )
    parser.add_argument(
        "--runtimes",
        default=None,
        help="comma-separated: cpu (the CPU kernel's FFNs, PyTorch attention), cpu-native (the whole step in "
        "native code), ort (default all three); with --sequences one of cpu-native (default), cuda, cuda-emulated",
    )
    parser.add_argument(
        "--max-memory-gb",
        type=common.gigabytes,
        default=8.0,
        help="refuse configurations estimated above this (default 8)",
    )
    parser.add_argument(
        "--quantized", type=int, choices=BITS, default=None, metavar="BITS", help="int4 or int8 DeaMoE FFN weights"
    )
    parser.add_argument(
        "--group-size", type=int, choices=GROUP_SIZES, default=64, help="with --quantized: columns per scale (def. 64)"
    )
    parser.add_argument(
        "--linears",
        default="",
        metavar="PARTS",
        help="with --quantized: these projections too, comma-separated: attention, head",
    )
    parser.add_argument(
        "--attention",
        choices=("gqa", "mla"),
        default="gqa",
        help="gqa: Qwen3-30B-A3B's attention (default); mla: DeepSeek-V2-Lite's latent attention",
    )
    parser.add_argument(
        "--llama-bench",
        type=Path,
        default=None,
        metavar="PATH",
        help="a llama-bench binary: time llama.cpp on the vanilla twin as GGUF f16, Q8_0 and Q4_0",
    )
    parser.add_argument(
        "--llama-tokens", type=common.positive_int, default=64, help="decode steps per llama-bench call (default 64)"
    )
    parser.add_argument(
        "--gguf-dir", type=Path, default=None, help="with --llama-bench: keep the GGUF files here (default: a temp dir)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the raw result here")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG plot here")
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..bench.lm_bench import RUNTIMES, lm_bench_table, run_lm_bench, write_plot
    from ..errors import UsageError
    from ..quant import QuantConfig

    if args.sequences is not None:
        return _run_batched(args)
    text = args.runtimes or "cpu,cpu-native,ort"
    runtimes = tuple(r.strip() for r in text.split(",") if r.strip())
    if not runtimes or any(r not in RUNTIMES for r in runtimes):
        raise UsageError(f"--runtimes takes a comma-separated list of {', '.join(RUNTIMES)}, got {text!r}")
    result = run_lm_bench(
        layers=args.layers,
        departments=args.departments,
        steps=args.steps,
        threads=args.threads,
        runtimes=runtimes,
        max_memory=args.max_memory_gb * 2**30,
        quant=QuantConfig(args.quantized, args.group_size) if args.quantized else None,
        linears=tuple(p.strip() for p in args.linears.split(",") if p.strip()),
        attention=args.attention,
        llama_bench=args.llama_bench,
        llama_tokens=args.llama_tokens,
        gguf_dir=args.gguf_dir,
    )
    print(lm_bench_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.plot:
        write_plot(result, args.plot)
    return 0


def _run_batched(args) -> int:
    from ..bench.lm_bench import BATCH_RUNTIMES, lm_batch_table, run_lm_batch_bench
    from ..errors import UsageError
    from ..quant import QuantConfig

    runtime = (args.runtimes or "cpu-native").strip()
    if runtime not in BATCH_RUNTIMES:
        raise UsageError(
            "--sequences times the native step's batch decoder (cpu-native) or the CUDA decoder (cuda, "
            f"cuda-emulated): give one of them to --runtimes, got {args.runtimes!r}"
        )
    if args.attention != "gqa" and runtime == "cpu-native":
        raise UsageError("--sequences runs the native step, which does not run MLA; drop --attention mla")
    if args.plot:
        raise UsageError("--plot draws the one-sequence table; drop it with --sequences")
    result = run_lm_batch_bench(
        sequences=tuple(args.sequences),
        layers=args.layers,
        departments=args.departments,
        steps=args.steps,
        threads=args.threads,
        max_memory=args.max_memory_gb * 2**30,
        quant=QuantConfig(args.quantized, args.group_size) if args.quantized else None,
        linears=tuple(p.strip() for p in args.linears.split(",") if p.strip()),
        llama_bench=args.llama_bench,
        llama_tokens=args.llama_tokens,
        gguf_dir=args.gguf_dir,
        runtime=runtime,
        attention=args.attention,
    )
    print(lm_batch_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0
