"""Batched decoding on vLLM: throughput and time per output token at 1, 2, 4, 8 and 16 concurrent
sequences, a DeaMoE language model against its expanded and vanilla twins, interleaved.

    .venv-vllm/bin/python -m deamoe_trt.integrations.vllm.bench [--layers 2] [--departments 4] ...

The model is bench-lm's (deamoe_trt.bench.lm_bench.bench_config): Qwen3-30B-A3B's attention
and DeaMoE FFNs of qwen3-30b-a3b-layer's shapes (experts 768 wide, 384 shared in the
department + 384 private, top-8 experts from the top-2 departments), random seeded weights,
bfloat16 by default. Its expanded twin computes the same function without sharing; its
vanilla twin is the one-stage top-8 MoE of the same experts. Each twin is written as a vLLM
model directory (deamoe_trt.integrations.vllm.export) and gets an engine; the three engines
are resident at once.

With --ffn each twin runs twice, its FFNs on vLLM's FusedMoE and on deamoe-trt's CPU kernel
through the deamoe::cpu_ffn custom op (deamoe_trt.integrations.vllm.ffn_op; float32 or float16,
the kernel's dtypes; --twins deamoe for the DeaMoE model alone): the measurement behind
ffn_op.DEFAULT_FFN. --quantized 4 or 8 quantizes every twin's FFNs round to nearest, group size
128 (vLLM's FusedMoE then runs its own CPU int4 kernel, float16 or bfloat16 only): the
measurement behind ffn_op.QUANTIZED_DEFAULT_FFN.

Method: for each number of sequences c, `--rounds` rounds; in each round the twins take turns
(the order rotates every round) on the same c random prompts of `--prompt` tokens, greedy,
end-of-text ignored: once with max_tokens 1 (prefill and first token, T1) and once with
max_tokens `--tokens` (T). TPOT = (T - T1) / (tokens - 1): one decode step of the whole batch
of c; throughput = c * tokens / T. Medians over rounds. The engines run eagerly
(enforce_eager: no torch.compile), the same for all three twins.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from ...bench.lm_bench import TWINS, bench_config
from ...bench.machine import load_average, machine_info
from ...console import format_table
from ...errors import DeaMoEError, UsageError, one_line

CONCURRENCY = (1, 2, 4, 8, 16)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
QUANT_GROUP_SIZE = 128


def write_twins(
    directory: Path,
    *,
    layers: int,
    departments: int,
    dtype: torch.dtype,
    seed: int,
    twins: tuple[str, ...] = TWINS,
    quantized: int = 0,
) -> dict[str, Path]:
    """The DeaMoE model and its twins (quantized: their FFNs int4/int8, group size
    QUANT_GROUP_SIZE) as vLLM model directories under directory."""
    from ...lm.model import DeaMoELM
    from ...lm.tokenizer import ByteTokenizer
    from ...quant import QuantConfig
    from .export import write_lm_dir

    config = bench_config(layers, departments)
    model = DeaMoELM.random(config, seed=seed, dtype=dtype)
    tokenizer = ByteTokenizer(vocab_size=config.vocab_size)
    directories = {}
    for twin in twins:
        served = model.twin(twin)
        if quantized:
            served = served.quantized(QuantConfig(quantized, QUANT_GROUP_SIZE))
        directories[twin] = write_lm_dir(served, tokenizer, directory / twin)
    return directories


def _timed(llm, prompts, max_tokens: int) -> float:
    import vllm

    params = vllm.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    if any(len(o.outputs[0].token_ids) != max_tokens for o in outputs):
        raise DeaMoEError("an engine returned fewer tokens than asked for")
    return elapsed


def run_vllm_bench(
    *,
    layers: int = 2,
    departments: int = 4,
    dtype: str = "bfloat16",
    concurrency: tuple[int, ...] = CONCURRENCY,
    tokens: int = 16,
    prompt: int = 16,
    rounds: int = 3,
    memory_fraction: float = 0.12,
    seed: int = 0,
    ffn: bool = False,
    twins: tuple[str, ...] = TWINS,
    quantized: int = 0,
    progress=print,
) -> dict:
    import vllm

    from .ffn_op import ENV, FFN_CHOICES

    if tokens < 2:
        raise UsageError(f"--tokens must be >= 2 (TPOT needs a decode step after the first token), got {tokens}")
    unknown = [twin for twin in twins if twin not in TWINS]
    if unknown or "deamoe" not in twins or (not ffn and set(twins) != set(TWINS)):
        raise UsageError(
            f"--twins {','.join(twins)}: name deamoe and, with --ffn, any of {', '.join(TWINS[1:])} "
            "(without --ffn all three)"
        )
    gen = torch.Generator().manual_seed(seed + 1)
    vocab = bench_config(layers, departments).vocab_size
    prompts = {
        c: [
            vllm.TokensPrompt(prompt_token_ids=torch.randint(0, vocab, (prompt,), generator=gen).tolist())
            for _ in range(c)
        ]
        for c in concurrency
    }
    times: dict[tuple[str, int], list[tuple[float, float]]] = {}
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="deamoe-vllm-bench-") as tmp:
        kind = f"int{quantized} " if quantized else ""
        progress(f"writing the {kind}twins {', '.join(twins)} ({layers} blocks, {departments} departments, {dtype})")
        directories = write_twins(
            Path(tmp),
            layers=layers,
            departments=departments,
            dtype=DTYPES[dtype],
            seed=seed,
            twins=twins,
            quantized=quantized,
        )
        # name -> (directory, the FFN choice its engine's processes inherit)
        contenders = (
            {f"{twin}/{choice}": (path, choice) for twin, path in directories.items() for choice in FFN_CHOICES}
            if ffn
            else {twin: (directory, "fusedmoe") for twin, directory in directories.items()}
        )
        names = tuple(contenders)
        engines = {}
        for name, (directory, choice) in contenders.items():
            progress(f"starting the {name} engine")
            os.environ[ENV] = choice
            engines[name] = vllm.LLM(
                str(directory),
                dtype=dtype,
                enforce_eager=True,
                max_model_len=prompt + tokens + 8,
                max_num_seqs=max(concurrency),
                gpu_memory_utilization=memory_fraction,
                seed=seed,
            )
        os.environ.pop(ENV, None)
        for llm in engines.values():  # untimed warm-up of every batch size
            for c in concurrency:
                _timed(llm, prompts[c], 2)
        for c in concurrency:
            for r in range(rounds):
                order = names[r % len(names) :] + names[: r % len(names)]
                for twin in order:
                    first = _timed(engines[twin], prompts[c], 1)
                    total = _timed(engines[twin], prompts[c], tokens)
                    times.setdefault((twin, c), []).append((first, total))
            progress(f"{c} sequences done")
        for llm in engines.values():
            llm.llm_engine.engine_core.shutdown()
    rows = []
    for c in concurrency:
        for twin in names:
            runs = times[(twin, c)]
            tpot = statistics.median((total - first) / (tokens - 1) for first, total in runs)
            throughput = statistics.median(c * tokens / total for _, total in runs)
            rows.append({"sequences": c, "twin": twin, "tpot_s": tpot, "tokens_per_s": throughput})
    return {
        "config": {
            "layers": layers,
            "departments": departments,
            "dtype": dtype,
            "tokens": tokens,
            "prompt": prompt,
            "rounds": rounds,
            "seed": seed,
            "ffn": ffn,
            "quantized": quantized,
        },
        "vllm": vllm.__version__,
        "machine": machine_info(int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count() or 1),
        "load_average_before": load_before,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(),
        "rows": rows,
    }


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def vllm_ffn_table(result: dict) -> str:
    """--ffn's table: each twin's TPOT on FusedMoE and on the op, FusedMoE's TPOT over the op's,
    and each twin's TPOT over the DeaMoE model's on the faster path of each."""
    by = {(r["twin"], r["sequences"]): r for r in result["rows"]}
    twins = list(dict.fromkeys(r["twin"].split("/")[0] for r in result["rows"]))
    lines = []
    for c in sorted({r["sequences"] for r in result["rows"]}):
        for twin in twins:
            fused, kernel = by[(f"{twin}/fusedmoe", c)]["tpot_s"], by[(f"{twin}/cpu-kernel", c)]["tpot_s"]
            base = by[("deamoe/fusedmoe", c)]["tpot_s"], by[("deamoe/cpu-kernel", c)]["tpot_s"]
            lines.append(
                (
                    c,
                    twin,
                    f"{fused * 1e3:.1f}",
                    f"{kernel * 1e3:.1f}",
                    f"{fused / kernel:.2f}x",
                    f"{fused / base[0]:.2f}x / {kernel / base[1]:.2f}x",
                )
            )
    c = result["config"]
    weights = f"int{c['quantized']} FFNs, " if c.get("quantized") else ""
    title = (
        f"vLLM {result['vllm']}, FFNs on FusedMoE vs the deamoe::cpu_ffn op, {c['layers']} blocks, "
        f"{c['departments']} departments of 8 experts, {weights}{c['dtype']}: {c['prompt']}-token prompts, "
        f"{c['tokens']} new tokens, median of {c['rounds']} interleaved rounds"
    )
    return format_table(
        ("sequences", "model", "FusedMoE TPOT ms", "op TPOT ms", "FusedMoE / op", "TPOT / DeaMoE's (FusedMoE / op)"),
        lines,
        title=title,
        align="rlrrrr",
    )


def vllm_bench_table(result: dict) -> str:
    if result["config"].get("ffn"):
        return vllm_ffn_table(result)
    by = {(r["twin"], r["sequences"]): r for r in result["rows"]}
    lines = []
    for r in result["rows"]:
        mine, expanded, vanilla = r, by[("expanded", r["sequences"])], by[("vanilla", r["sequences"])]
        lines.append(
            (
                r["sequences"],
                r["twin"],
                f"{mine['tokens_per_s']:.1f}",
                f"{mine['tpot_s'] * 1e3:.1f}",
                f"{expanded['tpot_s'] / mine['tpot_s']:.2f}x",
                f"{vanilla['tpot_s'] / mine['tpot_s']:.2f}x",
            )
        )
    c = result["config"]
    title = (
        f"vLLM {result['vllm']}, {c['layers']} blocks, {c['departments']} departments of 8 experts, {c['dtype']}: "
        f"{c['prompt']}-token prompts, {c['tokens']} new tokens, median of {c['rounds']} interleaved rounds"
    )
    loads = [result.get("load_average_before"), result["machine"].get("load_average")]
    if all(loads):
        title += f"; load average {loads[0][0]:.1f} before, {loads[1][0]:.1f} after"
    return format_table(
        ("sequences", "model", "tokens/s", "TPOT ms", "expanded TPOT / this", "vanilla TPOT / this"),
        lines,
        title=title,
        align="rlrrrr",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deamoe_trt.integrations.vllm.bench", description=__doc__)
    parser.add_argument("--layers", type=int, default=2, help="decoder blocks (default 2)")
    parser.add_argument("--departments", type=int, default=4, help="departments of 8 experts per block (default 4)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16", help="default bfloat16")
    parser.add_argument(
        "--concurrency", default=",".join(map(str, CONCURRENCY)), help="sequences per batch (default 1,2,4,8,16)"
    )
    parser.add_argument("--tokens", type=int, default=16, help="new tokens per sequence (default 16)")
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens (default 16)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per batch size (default 3)")
    parser.add_argument("--memory-fraction", type=float, default=0.12, help="each engine's CPU memory share")
    parser.add_argument("--json", type=Path, default=None, help="write the raw result here")
    parser.add_argument(
        "--ffn",
        action="store_true",
        help="compare the DeaMoE model's FFNs on FusedMoE and on the CPU kernel's custom op (float32/float16)",
    )
    parser.add_argument(
        "--twins", default=",".join(TWINS), help=f"which twins, comma-separated (default {','.join(TWINS)})"
    )
    parser.add_argument(
        "--quantized", type=int, choices=(0, 4, 8), default=0, help="int4/int8 FFNs, group size 128 (default 0: off)"
    )
    args = parser.parse_args(argv)
    try:
        concurrency = tuple(int(part) for part in args.concurrency.split(","))
        result = run_vllm_bench(
            layers=args.layers,
            departments=args.departments,
            dtype=args.dtype,
            concurrency=concurrency,
            tokens=args.tokens,
            prompt=args.prompt,
            rounds=args.rounds,
            memory_fraction=args.memory_fraction,
            ffn=args.ffn,
            twins=tuple(part for part in args.twins.split(",") if part),
            quantized=args.quantized,
            progress=lambda text: print(text, file=sys.stderr, flush=True),
        )
    except (DeaMoEError, ValueError) as exc:
        print(f"{parser.prog}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    print(vllm_bench_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
    sys.exit(main())
