"""`deamoe-trt import-hf`: a local Hugging Face MoE model's MoE layers as a deamoe-trt checkpoint.

Reads MODEL_DIR (config.json + *.safetensors; pickled *.bin weights are refused) with
transformers, imports every MoE layer (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3) as a
DeaMoE layer with the same outputs, and writes them as one checkpoint. Dense layers are
skipped; the checkpoint's config.json records the model type and the HF layer indices.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import args as common

DTYPES = ("auto", *common.DTYPE_NAMES)


def layer_selection(text: str) -> list[int] | None:
    """'all' -> None; '1,3' -> [1, 3] (HF layer indices)."""
    if text.strip().lower() == "all":
        return None
    try:
        indices = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 'all' or comma-separated layer indices like 1,3, got {text!r}"
        ) from None
    if not indices or any(i < 0 for i in indices):
        raise argparse.ArgumentTypeError(f"layer indices must be integers >= 0, got {text!r}")
    return list(dict.fromkeys(indices))


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "import-hf",
        help="import a local Hugging Face MoE model's MoE layers as a checkpoint",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model_dir", metavar="MODEL_DIR", help="local Hugging Face model directory")
    common.add_output(parser, help="checkpoint directory to write", directory=True)
    parser.add_argument(
        "--layers",
        type=layer_selection,
        default=None,
        metavar="all|I,J,...",
        help="HF decoder layer indices to import (default all MoE layers; dense layers cannot be chosen)",
    )
    parser.add_argument(
        "--dtype", choices=DTYPES, default="auto", help="checkpoint dtype (default auto: as the model stores it)"
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..checkpoint import CONFIG_FILE, FORMAT, save_checkpoint
    from ..errors import UsageError
    from ..importers.hf_dir import load_hf_dir, read_hf_config

    model_dir, output = Path(args.model_dir), Path(args.output)
    read_hf_config(model_dir)  # bad input fails before anything heavy is imported
    if output.exists() and model_dir.exists() and output.resolve() == model_dir.resolve():
        raise UsageError(f"-o {output} is the model directory itself; write the checkpoint elsewhere")
    existing = output / CONFIG_FILE
    if existing.is_file():
        try:
            is_ours = json.loads(existing.read_text()).get("format") == FORMAT
        except (ValueError, UnicodeDecodeError, AttributeError):
            is_ours = False
        if not is_ours:
            raise UsageError(f"refusing to overwrite {existing}: it is not a deamoe-trt checkpoint")

    dtype = None if args.dtype == "auto" else common.DTYPE_NAMES[args.dtype]
    stack = load_hf_dir(model_dir, layers=args.layers, dtype=dtype)
    save_checkpoint(stack, output, source=stack.source)
    c = stack.config
    layers = stack.source["layers"]
    print(
        f"imported {len(layers)} MoE layer(s) of {stack.source['hf_model_type']} (HF layers "
        f"{', '.join(map(str, layers))}) from {model_dir} to {output}: d={c.hidden_size}, "
        f"{c.num_experts} experts of width {c.expert_intermediate_size}, top-{c.top_k}, "
        f"{c.num_departments} department(s) keep {c.top_departments}, "
        f"{str(stack.dtype).removeprefix('torch.')}"
    )
    return 0
