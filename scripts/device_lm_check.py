"""Whole-model decoding on one CUDA GPU: DeaMoE against its expanded and vanilla twins on the
CUDA runtime's batch decoder (deamoe_trt.runtimes.cuda_decoder), and the vanilla twin's shape
as a Hugging Face transformers Qwen3-MoE model with a static cache and torch.compile (the GPU
peer), at several sequences a step; writes OUT/lm_check.json and OUT/lm_check.md.

    python scripts/device_lm_check.py --out OUT                    # an H100: a few minutes
    python scripts/device_lm_check.py --out OUT --tiny --emulated  # anywhere: the flow, on the emulator

The model has Qwen3-30B-A3B's block shape (deamoe_trt.bench.lm_bench.bench_config: hidden
2048, 32 query and 4 key-value heads of 128, 128 experts of 768 as 16 departments of 8,
half of each expert shared, top-8 in 2 departments) with --blocks blocks and random weights
drawn on the device, in bfloat16 and with its FFNs in int4 (group 128; attention and head
stay bfloat16). Each contender steps its sequences together: TPOT is the median wall time
of a step (tokens in, logits back on the host), tokens/s is sequences / TPOT, and the bytes
a step reads count the FFN weights the step's routing used (deamoe_trt.traffic, one step's
FFN inputs recorded) plus every other weight once; "of copy" divides bytes/TPOT by the
device-to-device copy bandwidth measured in the same run. The peer's weights are random of
the vanilla twin's shapes (its bytes a step are the vanilla twin's).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deamoe_trt._io import atomic_path  # noqa: E402
from deamoe_trt.lm.model import TWINS, DeaMoELM  # noqa: E402
from deamoe_trt.quant import QuantConfig  # noqa: E402
from deamoe_trt.runtimes.cuda import CudaRuntime  # noqa: E402
from deamoe_trt.traffic import weights_loaded  # noqa: E402

PROMPT = 32  # prompt tokens of every sequence


def log(message: str) -> None:
    print(f"[lm-check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def model_config(args):
    from deamoe_trt.bench.lm_bench import bench_config

    context = PROMPT + args.warmup + args.steps + 8
    if args.tiny:
        from deamoe_trt.config import DeaMoEConfig
        from deamoe_trt.lm.config import LMConfig

        moe = DeaMoEConfig(
            hidden_size=32,
            num_departments=2,
            experts_per_department=4,
            shared_intermediate_size=32,
            private_intermediate_size=32,
            top_k=2,
            top_departments=1,
        )
        return LMConfig(
            vocab_size=args.vocab or 256,
            hidden_size=32,
            num_layers=args.blocks,
            num_heads=4,
            num_key_value_heads=2,
            qk_norm="head",
            max_position_embeddings=context,
            moe=moe,
        )
    return bench_config(layers=args.blocks, departments=16, vocab=args.vocab or 151936, context=context)


@torch.no_grad()
def random_model(config, device: torch.device, dtype: torch.dtype, seed: int) -> DeaMoELM:
    """Random weights drawn on the device (reset_parameters draws on the CPU: minutes at this size):
    norms 1, every other tensor normal with std 1/sqrt(its input width)."""
    model = DeaMoELM(config, dtype=dtype, device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        else:
            std = 1.0 / math.sqrt(param.shape[-1])
            param.copy_(torch.randn(param.shape, generator=gen, device=device, dtype=torch.float32) * std)
    return model.eval()


def copy_bandwidth(device: torch.device) -> float:
    """Bytes/s of a device-to-device copy of 1 GiB (read + write), best of 5 (0 on the CPU)."""
    if device.type != "cuda":
        return 0.0
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = math.inf
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    del src, dst
    return 2 * (1 << 30) / best


def other_bytes(model: DeaMoELM, sequences: int) -> int:
    """Bytes a step reads outside the DeaMoE FFNs: every weight once, an embedding row per sequence."""
    ffn = tuple(f"layers.{i}.mlp." for i in model.moe_layers())
    total = 0
    for name, t in model.state_dict().items():
        if name.startswith(ffn):
            continue
        if name == "embed_tokens.weight":
            total += sequences * t.shape[1] * t.element_size()
        else:
            total += t.numel() * t.element_size()
    return total


def step_bytes(decoder, sequences: int) -> int:
    """Bytes of the last step replayed eagerly with each FFN's input recorded: the FFN weights
    its routing used (deamoe_trt.traffic.weights_loaded) plus other_bytes."""
    inputs = {}
    saved = dict(decoder.ffns)
    for i, ffn in saved.items():

        def recording(y, i=i, ffn=ffn):
            inputs[i] = y.detach().clone()
            return ffn(y)

        decoder.ffns[i] = recording
    try:
        decoder._compute(sequences)  # the same inputs again: it rewrites the same cache entries
    finally:
        decoder.ffns.update(saved)
    total = other_bytes(decoder.model, sequences)
    for i, y in inputs.items():
        layer = decoder.model.layers[i].mlp
        with torch.no_grad():
            routing = layer.route(y.to(layer.dtype))
        router = layer.router.weight.element_size()
        total += weights_loaded(layer.config, routing, layer.dtype.itemsize, layer.quant, router).total
    return total


def time_ours(
    runtime, model, twin: str, label: str, args, bandwidth: float, rows: list[dict], projections: str = "torch"
) -> None:
    """Rows of model (a twin, its weights `label`) on the runtime's batch decoder, appended to
    rows; projections "kernels": q/k/v/o and head on the kernel library's GEMV too."""
    # model is the twin already (an int4 twin is quantized from the bf16 one).
    context = PROMPT + args.warmup + args.steps + 8
    decoder = runtime.batch_decoder(
        model, max_sequences=max(args.sequences), max_context=context, projections=projections
    )
    name = f"deamoe-trt CUDA ({twin})" if projections == "torch" else f"deamoe-trt CUDA ({twin}, GEMV projections)"
    gen = torch.Generator().manual_seed(1)
    for n in args.sequences:
        prompts = [torch.randint(0, model.config.vocab_size, (PROMPT,), generator=gen).tolist() for _ in range(n)]
        seqs, tokens = [], []
        for prompt in prompts:
            seq, logits = decoder.open(prompt)
            seqs.append(seq)
            tokens.append(int(logits.argmax()))
        times = []
        for step in range(args.warmup + args.steps):
            start = time.perf_counter()
            logits = decoder.step(seqs, tokens)
            elapsed = time.perf_counter() - start
            tokens = [int(t) for t in logits.argmax(axis=1)]
            if step >= args.warmup:
                times.append(elapsed)
        tpot = statistics.median(times)
        read = step_bytes(decoder, n)
        rows.append(
            {
                "contender": name,
                "twin": twin,
                "weights": label,
                "sequences": n,
                "tpot_ms": 1e3 * tpot,
                "tokens_per_s": n / tpot,
                "bytes_per_step": read,
                "of_copy": read / tpot / bandwidth if bandwidth else None,
                "graphs": sorted(k for k, g in decoder._graphs.items() if g is not None),
                "graph_error": decoder.graph_error,
            }
        )
        log(f"{name} {label} x{n}: TPOT {1e3 * tpot:.3f} ms, {read / 1e6:.1f} MB/step")
        for seq in seqs:
            decoder.close(seq)
    del decoder


def hf_peer(
    config, device: torch.device, dtype: torch.dtype, args, vanilla_bytes: dict[int, int], deadline: float, result: dict
) -> None:
    """The vanilla twin's shape as transformers' Qwen3-MoE, static cache, torch.compile, a row
    per count of sequences added to result; per-step times from a stopping criterion's clock
    (each generate step already synchronises on its finished-sequences check)."""
    import transformers

    moe = config.moe.vanilla()
    hf_config = transformers.Qwen3MoeConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=moe.private_intermediate_size * 4,
        moe_intermediate_size=moe.private_intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        num_experts=moe.num_experts,
        num_experts_per_tok=moe.top_k,
        norm_topk_prob=True,
        max_position_embeddings=config.max_position_embeddings,
        rope_theta=config.rope_theta,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        tie_word_embeddings=False,
    )
    with torch.device(device):
        model = transformers.Qwen3MoeForCausalLM(hf_config).to(dtype).eval()
    model.generation_config.cache_implementation = "static"
    model.generation_config.pad_token_id = 0
    # generate compiles the forward itself with a static cache on a GPU (transformers' auto-compile,
    # CUDA graphs included); disable_compile turns that off.
    model.generation_config.disable_compile = not args.compile

    class Clock(transformers.StoppingCriteria):
        def __init__(self):
            self.stamps: list[float] = []

        def __call__(self, input_ids, scores, **kwargs):
            self.stamps.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    gen = torch.Generator().manual_seed(1)
    for n in args.sequences:
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{n} sequences and up skipped, past the {args.budget_s:.0f} s budget")
        ids = torch.randint(0, config.vocab_size, (n, PROMPT), generator=gen).to(device)
        new = args.warmup + args.steps + 1
        for _ in range(2):  # the first compiles for this shape
            clock = Clock()
            with torch.no_grad():
                model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=new,
                    min_new_tokens=new,
                    do_sample=False,
                    stopping_criteria=transformers.StoppingCriteriaList([clock]),
                )
        gaps = [b - a for a, b in zip(clock.stamps, clock.stamps[1:], strict=False)][args.warmup :]
        tpot = statistics.median(gaps)
        result["rows"].append(
            {
                "contender": "transformers Qwen3-MoE (vanilla shape)"
                + (", static cache, compiled" if args.compile and device.type == "cuda" else ""),
                "twin": "vanilla",
                "weights": "bf16" if dtype == torch.bfloat16 else str(dtype).removeprefix("torch."),
                "sequences": n,
                "tpot_ms": 1e3 * tpot,
                "tokens_per_s": n / tpot,
                "bytes_per_step": vanilla_bytes.get(n),
                "of_copy": None,
            }
        )
        log(f"peer x{n}: TPOT {1e3 * tpot:.3f} ms")


def targets(rows: list[dict]) -> list[str]:
    """The paper's end-to-end figure (DeaMoE >= 1.33x its vanilla twin at 1 sequence) and the
    peer's (DeaMoE ahead of transformers on the vanilla model by >= 0.9x the bytes ratio), each
    met or not."""

    def find(contender: str, weights: str, n: int) -> dict | None:
        return next(
            (
                r
                for r in rows
                if r["contender"].startswith(contender) and r["weights"] == weights and r["sequences"] == n
            ),
            None,
        )

    out = []
    for weights, how in (("bf16", ""), ("int4", ""), ("bf16", ", GEMV projections")):
        ours = find(f"deamoe-trt CUDA (deamoe{how})", weights, 1)
        vanilla = find(f"deamoe-trt CUDA (vanilla{how})", weights, 1)
        if ours and vanilla:
            ratio = vanilla["tpot_ms"] / ours["tpot_ms"]
            out.append(
                f"- {weights}{how}, 1 sequence: DeaMoE {ratio:.2f}x its vanilla twin (target 1.33x): "
                + ("met" if ratio >= 1.33 else "not met")
            )
    for n in sorted({r["sequences"] for r in rows}):
        ours, peer = find("deamoe-trt CUDA (deamoe)", "bf16", n), find("transformers", "bf16", n)
        if ours and peer and ours.get("bytes_per_step") and peer.get("bytes_per_step"):
            speed, read = peer["tpot_ms"] / ours["tpot_ms"], peer["bytes_per_step"] / ours["bytes_per_step"]
            out.append(
                f"- bf16, {n} sequences: DeaMoE {speed:.2f}x the peer, bytes ratio {read:.2f} "
                f"(target {0.9 * read:.2f}x): " + ("met" if speed >= 0.9 * read else "not met")
            )
    return out


def table(result: dict) -> str:
    lines = [
        f"Whole model, {result['model']}; {result['device']}; {result['date']}, commit {result['commit']}; "
        f"`{result['command']}`",
        "",
        "| contender | weights | sequences | TPOT ms | tokens/s | MB/step | of copy | vs vanilla | vs peer |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    rows = result["rows"]
    for r in rows:
        vanilla = next(
            (
                o
                for o in rows
                if o["twin"] == "vanilla"
                and o["weights"] == r["weights"]
                and o["sequences"] == r["sequences"]
                and not o["contender"].startswith("transformers")
                and ("GEMV" in o["contender"]) == ("GEMV" in r["contender"])
            ),
            None,
        )
        peer = next(
            (o for o in rows if o["contender"].startswith("transformers") and o["sequences"] == r["sequences"]), None
        )
        mb = f"{r['bytes_per_step'] / 1e6:.1f}" if r.get("bytes_per_step") else "-"
        share = f"{100 * r['of_copy']:.0f}%" if r.get("of_copy") else "-"
        vs = f"{vanilla['tpot_ms'] / r['tpot_ms']:.2f}x" if vanilla else "-"
        vp = f"{peer['tpot_ms'] / r['tpot_ms']:.2f}x" if peer and r["weights"] == peer["weights"] else "-"
        lines.append(
            f"| {r['contender']} | {r['weights']} | {r['sequences']} | {r['tpot_ms']:.3f} | {r['tokens_per_s']:.1f} "
            f"| {mb} | {share} | {vs} | {vp} |"
        )
    lines += [
        "",
        f"Copy bandwidth measured in this run: {result['copy_gbps']:.0f} GB/s. vs vanilla / vs peer: their TPOT "
        "over this row's (> 1: this row is faster).",
    ]
    lines += ["", *targets(rows)]
    if result.get("errors"):
        lines += ["", *(f"- {e}" for e in result["errors"])]
    return "\n".join(lines) + "\n"


def _commit() -> str:
    try:
        return (
            subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or "unknown"
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="folder for lm_check.json and lm_check.md")
    parser.add_argument("--blocks", type=int, default=None, help="blocks (default 8; --tiny: 2)")
    parser.add_argument("--vocab", type=int, default=0, help="vocabulary (default Qwen3's 151936; --tiny: 256)")
    parser.add_argument("--sequences", default=None, help="comma-separated counts (default 1,4,16; --tiny: 1,2)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per count (default 32; --tiny: 2)")
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="untimed steps first (default 3, the graph captured in them; --emulated: 1)",
    )
    parser.add_argument("--weights", default="bf16,int4", help="bf16, int4 or both (default)")
    parser.add_argument("--twins", default=",".join(TWINS), help="twins to time (default all three)")
    parser.add_argument("--tiny", action="store_true", help="a micro model of the same layout (hidden 32)")
    parser.add_argument("--emulated", action="store_true", help="the kernels under the SIMT emulator, on the CPU")
    parser.add_argument("--library", default=None, help="the kernel library (default: deamoe_trt.cuda's search)")
    parser.add_argument(
        "--peer", choices=("auto", "off"), default="auto", help="the transformers peer (auto: if importable)"
    )
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="the peer without torch.compile")
    parser.add_argument(
        "--no-kernel-projections",
        dest="kernel_projections",
        action="store_false",
        help="leave out the bf16 rows with q/k/v/o and head on the kernel library's GEMV",
    )
    parser.add_argument("--budget-s", type=float, default=230, help="skip what is left after this many seconds")
    args = parser.parse_args(argv)
    args.blocks = args.blocks or (2 if args.tiny else 8)
    args.steps = args.steps or (2 if args.tiny else 32)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.emulated else 3)
    args.sequences = [int(s) for s in (args.sequences or ("1,2" if args.tiny else "1,4,16")).split(",")]
    weights = [w for w in args.weights.split(",") if w]
    twins = [t for t in args.twins.split(",") if t]
    if any(w not in ("bf16", "int4") for w in weights) or any(t not in TWINS for t in twins):
        parser.error(f"--weights takes bf16,int4 and --twins {','.join(TWINS)}")

    started = time.perf_counter()
    runtime = CudaRuntime.emulated(args.library) if args.emulated else CudaRuntime(library=args.library)
    if reason := runtime.available():
        print(f"device_lm_check: {reason} (use --emulated for the flow on the CPU)", file=sys.stderr)
        return 2
    runtime.load_library()
    device = runtime.device
    config = model_config(args)
    bandwidth = copy_bandwidth(device)
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"SIMT emulator on {platform.processor() or 'CPU'}"
    )
    result = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "commit": _commit(),
        "device": name,
        "command": "python scripts/device_lm_check.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": f"{config.num_layers} blocks of hidden {config.hidden_size}, {config.moe.num_experts} experts "
        f"({config.moe.num_departments} departments), top-{config.moe.top_k}, vocab {config.vocab_size}",
        "config": config.to_dict(),
        "copy_gbps": bandwidth / 1e9,
        "rows": [],
        "errors": [],
    }
    log(f"{result['model']} on {name}; copy {bandwidth / 1e9:.0f} GB/s")
    base = random_model(config, device, torch.bfloat16, seed=0)
    for label in weights:
        for twin in twins:
            if time.perf_counter() - started > args.budget_s:
                result["errors"].append(f"{label} {twin}: skipped, past the {args.budget_s:.0f} s budget")
                continue
            model = base.twin(twin)
            if label == "int4":
                model = model.quantized(QuantConfig(bits=4, group_size=128 if not args.tiny else 16))
            try:
                time_ours(runtime, model, twin, label, args, bandwidth, result["rows"])
            except Exception as exc:  # one contender's failure must not lose the others' rows
                result["errors"].append(f"{label} {twin}: {type(exc).__name__}: {exc}".splitlines()[0])
                log(result["errors"][-1])
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if args.kernel_projections and "bf16" in weights:
        for twin in ("deamoe", "vanilla"):
            if time.perf_counter() - started > args.budget_s:
                result["errors"].append(f"bf16 {twin}, GEMV projections: skipped, past the {args.budget_s:.0f} s")
                continue
            try:
                time_ours(runtime, base.twin(twin), twin, "bf16", args, bandwidth, result["rows"], "kernels")
            except Exception as exc:
                result["errors"].append(f"bf16 {twin}, GEMV projections: {type(exc).__name__}: {exc}".splitlines()[0])
                log(result["errors"][-1])
            if device.type == "cuda":
                torch.cuda.empty_cache()
    vanilla_bytes = {
        r["sequences"]: r["bytes_per_step"] for r in result["rows"] if r["twin"] == "vanilla" and r["weights"] == "bf16"
    }
    del base
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if args.peer == "auto" and "bf16" in weights:
        if time.perf_counter() - started > args.budget_s:
            result["errors"].append(f"peer: skipped, past the {args.budget_s:.0f} s budget")
        else:
            try:
                deadline = started + args.budget_s
                hf_peer(config, device, torch.bfloat16, args, vanilla_bytes, deadline, result)
            except Exception as exc:
                result["errors"].append(f"peer: {type(exc).__name__}: {exc}".splitlines()[0])
                log(result["errors"][-1])
    result["seconds"] = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    with atomic_path(args.out / "lm_check.json") as tmp:
        tmp.write_text(json.dumps(result, indent=2) + "\n")
    text = table(result)
    with atomic_path(args.out / "lm_check.md") as tmp:
        tmp.write_text(text)
    print(text)
    ours = [r for r in result["rows"] if r["contender"].startswith("deamoe-trt")]
    return 0 if ours and not any(not e.startswith("peer") and "budget" not in e for e in result["errors"]) else 1


if __name__ == "__main__":
    sys.exit(main())
