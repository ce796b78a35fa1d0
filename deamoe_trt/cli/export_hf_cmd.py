"""`deamoe-trt export-hf`: a language-model checkpoint as a Hugging Face model directory.

DIR holds config.json (model_type "deamoe", auto_map), safetensors shards with
model.safetensors.index.json, the tokenizer, generation_config.json and the model's code, so
`AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)` loads it with only
transformers and torch installed (with deamoe-trt imported, without trust_remote_code).
`deamoe-trt import-hf DIR` reads it back. See docs/hf-models.md.
"""

from __future__ import annotations

from . import args as common


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export-hf",
        help="export a language-model checkpoint as a Hugging Face transformers model directory",
        description=__doc__,
    )
    common.add_checkpoint(parser, help="language-model checkpoint directory (trained, imported or converted)")
    common.add_output(parser, help="Hugging Face model directory to write", directory=True)
    common.add_twin(parser)
    parser.add_argument(
        "--max-shard-size",
        type=int,
        default=2048,
        metavar="MIB",
        help="largest safetensors shard in MiB (default 2048)",
    )
    common.add_force(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from .._io import check_not_input, check_replaceable
    from ..errors import UsageError
    from ..export.hf import write_hf_dir
    from ..hf.directory import is_model_dir
    from ..lm.checkpoint import load_lm

    if args.max_shard_size < 1:
        raise UsageError(f"--max-shard-size must be at least 1 (MiB), got {args.max_shard_size}")
    check_not_input(args.output, [args.checkpoint])
    check_replaceable(args.output, is_model_dir, "Hugging Face model directory", force=args.force)  # before loading
    loaded = load_lm(args.checkpoint)
    out = write_hf_dir(
        loaded.model.twin(args.twin),
        loaded.tokenizer,
        args.output,
        max_shard_bytes=args.max_shard_size * 2**20,
        force=args.force,
        note=common.note,
    )
    print(f"wrote {out} (Hugging Face model directory, {args.twin}; AutoModelForCausalLM.from_pretrained)")
    return 0
