"""`deamoe-trt demo`: the main job on the built-in tiny model, end to end."""

from __future__ import annotations

import tempfile
from pathlib import Path

from . import args as common


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo", help="run the whole toolchain on the built-in tiny model", description=__doc__
    )
    common.add_output(parser, required=False, help="keep the demo's files here (default: a temporary directory)")
    common.add_seed(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    if args.output:
        return _demo(Path(args.output), args.seed)
    with tempfile.TemporaryDirectory(prefix="deamoe-demo-") as tmp:
        return _demo(Path(tmp), args.seed)


def _demo(workdir: Path, seed: int) -> int:
    import torch

    from ..checkpoint import load_checkpoint
    from ..inputs import random_hidden
    from ..layer import DeaMoEStack
    from ..presets import get_preset
    from ..summary import config_table, routing_table, traffic_table

    config = get_preset("tiny")
    checkpoint = workdir / "tiny"
    DeaMoEStack.random(config, 1, seed=seed).save_pretrained(checkpoint)
    print(f"[1] made the tiny preset: {checkpoint}\n")
    layer = load_checkpoint(checkpoint).layers[0]
    print(config_table(config), end="\n\n")

    x = random_hidden(4, config.hidden_size, seed=seed)
    with torch.no_grad():
        routing = layer.route(x)
        y = layer(x)
        twin = layer.expanded()(x)
    print("[2] ran it on 4 random tokens")
    print(routing_table(layer, routing))
    print(f"expanded twin (no sharing) max |difference| from DeaMoE: {(y - twin).abs().max().item():.2e}\n")

    print("[3] " + traffic_table(load_checkpoint(checkpoint), [1, 2, 4, 8]))
    return 0
