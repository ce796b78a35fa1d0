"""`deamoe-trt demo`: the main job on the built-in tiny model, end to end.

Each step runs a real subcommand with the arguments printed beside it, so every step can
be rerun, changed and scaled up by hand."""

from __future__ import annotations

import functools
import shlex
import tempfile
from pathlib import Path

from . import args as common

# The trained tiny language model ships with the source tree (samples/models/tiny-lm).
TINY_LM = Path(__file__).resolve().parents[2] / "samples" / "models" / "tiny-lm"
# A vanilla MoE language model converted by `deamoe-trt convert` (docs/convert.md).
CONVERTED_LM = TINY_LM.parent / "tiny-lm-converted"


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
        return _demo(Path(args.output), args.seed)
    with tempfile.TemporaryDirectory(prefix="deamoe-demo-") as tmp:
        return _demo(Path(tmp), args.seed)


def _demo(workdir: Path, seed: int) -> int:
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
    _step(
        "benchmark time and bytes per step (quick, tiny preset; `deamoe-trt bench` for the real one)",
        ["bench", "--quick", "--json", workdir / "bench.json", "--plot", workdir / "bench.png"],
    )
    if TINY_LM.is_dir():
        _step(
            "generate text with the shipped tiny DeaMoE language model, DeaMoE vs its expanded twin",
            [
                *("generate", TINY_LM, "--prompt", "Anne Elliot was", "--max-new-tokens", 60),
                *("--runtime", "ort", "--twin", "deamoe,expanded"),
            ],
        )
    else:
        print(f"\n(skipped text generation: {TINY_LM} is in the source tree, not in an installed wheel)")
    if CONVERTED_LM.is_dir():
        _converted(CONVERTED_LM)
    print(f"\ndemo finished; files in {workdir}")
    return 0


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
    from ..lm.train import shipped_text

    loaded = load_lm(path)
    print(f"\n=== a trained vanilla MoE converted to DeaMoE ({path.name}): loads fewer bytes per step")
    print(recorded_table(loaded.training["conversion"]))
    print()
    text = shipped_text()[-1000:]  # from the held-out end of the text
    print(lm_bytes_table(loaded.model, loaded.tokenizer.encode(text[: loaded.model.config.max_position_embeddings])))
    _step(
        "generate with the converted model, DeaMoE vs its vanilla twin (shared neurons copied into every expert)",
        [*("generate", path, "--prompt", "Anne Elliot was", "--max-new-tokens", 40, "--twin", "deamoe,vanilla")],
    )
