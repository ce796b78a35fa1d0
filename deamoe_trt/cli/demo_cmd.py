"""`deamoe-trt demo`: the main job on the built-in tiny model, end to end, then the bytes and
time DeaMoE saves on one layer of Qwen3-30B-A3B's shape, where bytes set a step's time.

Each step runs a real subcommand with the arguments printed beside it, so every step can
be rerun, changed and scaled up by hand."""

from __future__ import annotations

import functools
import shlex
import tempfile
from pathlib import Path

from ..lm.shipped import TINY_LM
from ..lm.shipped import TINY_LM_CONVERTED as CONVERTED_LM
from . import args as common

# The benchmark's layer: big enough that streaming its weights, not the call, sets a step's
# time (the tiny preset's ~100 KB per step does not), small enough for a laptop's memory in fp16.
BENCH_PRESET, BENCH_DTYPE = "qwen3-30b-a3b-layer", "fp16"

TINY_LIMITS = """
=== what the tiny models can and cannot show
The tiny preset and the 1.1M-parameter sample language models show the mechanics: two-stage
routing, the bytes a step loads (counted from its routing), exports that match the reference,
twins that decode the same tokens. They cannot show speed: a tiny step reads ~100 KB, so call
overhead, not bytes, sets its time, and DeaMoE can time slower than its twin there. Nor can
they show quality at scale (see the converted model at the end). Speed needs a layer whose
step streams tens of MB: one of Qwen3-30B-A3B's shape, next."""
CONVERTED_LIMITS = """\
What this model can and cannot show: the bytes above, measured. Not quality: in a model this
small conversion visibly costs it (the first table: perplexity and next-token agreement against
the source, which is not shipped), and its vanilla twin below routes in one stage, so the two
write different text; neither is the source's. `deamoe-trt convert --report` measures a model of
your own."""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo", help="run the whole toolchain on the built-in tiny model", description=__doc__
    )
    common.add_output(
        parser, required=False, help="keep the demo's files here (default: a temporary directory)", directory=True
    )
    common.add_seed(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    if args.output:
        return _demo(Path(args.output), args.seed, kept=True)
    with tempfile.TemporaryDirectory(prefix="deamoe-demo-") as tmp:
        return _demo(Path(tmp), args.seed, kept=False)


def _demo(workdir: Path, seed: int, *, kept: bool) -> int:
    checkpoint = workdir / "tiny"
    _step("make the tiny preset", ["init", "--preset", "tiny", "-o", checkpoint, "--seed", seed])
    _routing(checkpoint, seed)
    _step("weights loaded per step, DeaMoE vs its twins", ["info", checkpoint, "--samples", 32, "--seed", seed])
    for form, dtype in (("plugin", "fp32"), ("ort", "fp32"), ("onnx", "fp16")):
        model = workdir / f"tiny-{form}-{dtype}.onnx"
        _step(
            f"export the {form} form ({dtype})", ["export", checkpoint, "-o", model, "--form", form, "--dtype", dtype]
        )
        _step(f"validate the {form} form on ONNX Runtime", ["validate", model, "--against", checkpoint, "--seed", seed])
    print(TINY_LIMITS)
    _step(
        f"time and bytes per step where bytes dominate: one {BENCH_PRESET} layer ({BENCH_DTYPE}) on the CPU kernel, "
        "interleaved with its expanded twin (`deamoe-trt bench` for every contender and token count)",
        [
            *("bench", "--preset", BENCH_PRESET, "--dtype", BENCH_DTYPE, "--tokens", "1,4", "--layers", 0),
            *("--only", "deamoe/cpu,expanded/cpu", "--steps", 100, "--seed", seed),
            *("--json", workdir / "bench.json", "--plot", workdir / "bench.png"),
        ],
    )
    print(_bench_summary(workdir / "bench.json"))
    _step(
        "generate text with the shipped tiny DeaMoE language model, DeaMoE vs its expanded twin",
        [
            *("generate", TINY_LM, "--prompt", "Anne Elliot was", "--max-new-tokens", 60),
            *("--runtime", "ort", "--twin", "deamoe,expanded"),
        ],
    )
    _converted(CONVERTED_LM)
    # A temporary folder is gone once the demo returns: name only one that stays.
    print(f"\ndemo finished; files in {workdir}" if kept else "\ndemo finished (keep its files with -o DIR)")
    return 0


def _bench_summary(path: Path) -> str:
    """DeaMoE's bytes and time per step against its twin's, from the benchmark run just made."""
    import json

    layer = json.loads(path.read_text())["layer"]
    if layer.get("status") != "ok":
        return f"(benchmark skipped: {layer.get('reason', 'see above')})"
    rows = {(r["contender"], r["tokens"]): r for r in layer["results"]}
    lines = [f"\n=== what DeaMoE saved against its expanded twin in this run ({layer['preset']}, {layer['dtype']})"]
    for tokens in sorted({t for _, t in rows}):
        ours, twin = rows.get(("deamoe/cpu", tokens)), rows.get(("expanded/cpu", tokens))
        if not (ours and twin):
            continue
        fewer = 1 - ours["bytes_per_step_mean"] / twin["bytes_per_step_mean"]
        lines.append(
            f"{tokens} token(s) per step: {ours['bytes_per_step_mean'] / 1e6:.1f} MB vs "
            f"{twin['bytes_per_step_mean'] / 1e6:.1f} MB ({fewer:.0%} fewer bytes, at most "
            f"{twin['bytes_per_step_mean'] / ours['bytes_per_step_mean']:.2f}x faster); "
            f"median {ours['median_s'] * 1e3:.2f} ms vs {twin['median_s'] * 1e3:.2f} ms "
            f"({twin['median_s'] / ours['median_s']:.2f}x)"
        )
    lines.append("Times from one interleaved run; on a machine busy with other work they move, the bytes do not.")
    return "\n".join(lines)


@functools.cache
def _parser():
    from .main import build_parser

    return build_parser()


def _step(title: str, argv: list) -> None:
    from ..errors import DeaMoEError

    argv = [str(a) for a in argv]
    print(f"\n=== {title}\n$ deamoe-trt {shlex.join(argv)}", flush=True)
    args = _parser().parse_args(argv)
    code = args.func(args) or 0
    if code:
        raise DeaMoEError(f"demo step `deamoe-trt {argv[0]}` exited with {code}")


def _routing(checkpoint: Path, seed: int) -> None:
    import torch

    from ..inputs import random_hidden
    from ..layer import DeaMoEStack
    from ..summary import routing_table

    layer = DeaMoEStack.from_pretrained(checkpoint).layers[0]
    x = random_hidden(4, layer.config.hidden_size, seed=seed)
    with torch.no_grad():
        routing = layer.route(x)
        difference = (layer(x) - layer.expanded()(x)).abs().max().item()
    print("\n=== route 4 random tokens: departments first, then experts inside them")
    print(routing_table(layer, routing))
    print(f"expanded twin (no sharing) max |difference| from DeaMoE: {difference:.2e}")


def _converted(path: Path) -> None:
    from ..convert.report import lm_bytes_table, recorded_table
    from ..lm import load_lm
    from ..train.lm import shipped_text

    loaded = load_lm(path)
    print(f"\n=== a trained vanilla MoE converted to DeaMoE ({path.name}): loads fewer bytes per step")
    print(recorded_table(loaded.training["conversion"]))
    print()
    text = shipped_text()[-1000:]  # from the held-out end of the text
    print(lm_bytes_table(loaded.model, loaded.tokenizer.encode(text[: loaded.model.config.max_position_embeddings])))
    print(CONVERTED_LIMITS)
    _step(
        "generate with the converted model, DeaMoE vs its vanilla twin (shared neurons copied into every expert)",
        [*("generate", path, "--prompt", "Anne Elliot was", "--max-new-tokens", 40, "--twin", "deamoe,vanilla")],
    )
