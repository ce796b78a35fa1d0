"""`deamoe-trt import-hf`: a local Hugging Face MoE model as a deamoe-trt checkpoint.

By default the whole model (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE, gpt-oss) becomes a language-model
checkpoint that `generate` and `export` read: attention, norms, dense layers, embeddings
and head copied, each MoE block a DeaMoE layer with the same outputs, tokenizer.json kept.
It is streamed from the safetensors shards tensor by tensor, so it needs about one tensor's
memory, not the model's; the peak resident memory is printed. A killed import rerun with the
same arguments writes only the blocks after those it finished (kept in OUTPUT.work).

With --layers-only (or --layers) only the MoE layers are imported, as a layer checkpoint
(Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3, gpt-oss with float experts), through
transformers. Pickled *.bin weights and models that need trust_remote_code are refused in
either mode.
"""

from __future__ import annotations

import argparse
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
        help="import a local Hugging Face MoE model (whole, or its MoE layers) as a checkpoint",
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
        help="import only these MoE layers (HF decoder layer indices) as a layer checkpoint; implies --layers-only",
    )
    parser.add_argument(
        "--layers-only",
        action="store_true",
        help="import the MoE layers alone as a layer checkpoint (the whole model is the default)",
    )
    parser.add_argument(
        "--dtype", choices=DTYPES, default="auto", help="checkpoint dtype (default auto: as the model stores it)"
    )
    common.add_force(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    if args.layers_only or args.layers is not None:
        return _run_layers(args)
    return _run_model(args)


def _run_model(args) -> int:
    import sys

    from .._io import check_not_input, check_replaceable, json_format_is
    from ..console import format_bytes
    from ..importers.hf_lm import import_hf_lm, read_config
    from ..lm.checkpoint import FORMAT
    from ..resources import peak_rss_bytes

    model_dir, output = Path(args.model_dir), Path(args.output)
    read_config(model_dir)
    check_not_input(output, [model_dir])
    # Refused before the import; import_hf_lm checks again as it replaces the folder.
    check_replaceable(output, json_format_is(FORMAT), "language-model checkpoint", force=args.force)
    dtype = None if args.dtype == "auto" else common.DTYPE_NAMES[args.dtype]
    print(f"importing {model_dir} (streamed, block by block)")
    config, summary = import_hf_lm(
        model_dir, output, dtype=dtype, progress=sys.stdout, force=args.force, note=common.note
    )
    moe = config.moe
    dense = f", dense layers {', '.join(map(str, config.dense_layers))}" if config.dense_layers else ""
    print(
        f"imported {summary['model_type']} as a language model to {output}: {config.num_layers} blocks{dense}, "
        f"d={config.hidden_size}, {moe.num_experts} experts of width {moe.expert_intermediate_size}, top-{moe.top_k}, "
        f"{summary['dtype']}, {format_bytes(summary['bytes'])} in {summary['seconds']:.1f} s; "
        f"peak RSS {format_bytes(peak_rss_bytes())}"
    )
    return 0


def _run_layers(args) -> int:
    from ..importers.hf_layers import import_hf_layers

    model_dir, output = Path(args.model_dir), Path(args.output)
    dtype = None if args.dtype == "auto" else common.DTYPE_NAMES[args.dtype]
    stack = import_hf_layers(model_dir, output, layers=args.layers, dtype=dtype, force=args.force, note=common.note)
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
