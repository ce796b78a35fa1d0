"""`deamoe-trt export-vllm`: a language-model checkpoint as a model directory vLLM serves.

DIR holds config.json (architecture DeaMoEForCausalLM, the LM config), model.safetensors, the
tokenizer and a chat template. With deamoe-trt installed beside vLLM (its plugin registers the
architecture): `vllm serve DIR`, `python -m deamoe_trt.integrations.vllm.serve DIR`, or
`vllm.LLM(DIR)`. See docs/serving.md.
"""

from __future__ import annotations

from . import args as common


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export-vllm",
        help="export a language-model checkpoint as a vLLM model directory (DeaMoE plugin architecture)",
        description=__doc__,
    )
    common.add_checkpoint(parser, help="language-model checkpoint directory (trained, imported or converted)")
    common.add_output(parser, help="vLLM model directory to write", directory=True)
    common.add_twin(parser)
    common.add_force(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from .._io import check_not_input, check_replaceable
    from ..hf.directory import is_model_dir
    from ..integrations.vllm.export import write_model_dir

    check_not_input(args.output, [args.checkpoint])
    check_replaceable(args.output, is_model_dir, "vLLM model directory", force=args.force)  # before loading
    out = write_model_dir(args.checkpoint, args.output, twin=args.twin, force=args.force, note=common.note)
    print(f"wrote {out} (vLLM model directory, {args.twin}; serve it with: vllm serve {out})")
    return 0
