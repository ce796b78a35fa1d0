"""`deamoe-trt export-edgellm`: a DeaMoE language model as a TensorRT Edge-LLM model directory.

Edge-LLM's own exporter writes DIR/llm/ (model.onnx + .data, config.json,
embedding.safetensors, tokenizer files, chat_template.jinja) with each MoE layer as one
DeaMoE plugin node; DIR/deamoe_trt.json names the plugin library the engine build must
load. Needs Edge-LLM (scripts/setup.sh makes .venv-edgellm); see docs/edge-llm.md.
"""

from __future__ import annotations

from . import args as common


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export-edgellm",
        help="export a language-model checkpoint as a TensorRT Edge-LLM model directory (DeaMoE plugin nodes)",
        description=__doc__,
    )
    common.add_checkpoint(parser, help="language-model checkpoint directory (imported, converted or quantized)")
    common.add_output(parser, help="Edge-LLM model directory to write", directory=True)
    common.add_dtype(parser, choices=("fp16",), default="fp16")
    parser.add_argument(
        "--edgellm-python",
        default=None,
        metavar="PYTHON",
        help="the Python that has tensorrt-edgellm (default: $DEAMOE_TRT_EDGELLM_PYTHON, then .venv-edgellm)",
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    from .._io import check_not_input
    from ..integrations.edgellm import export_edgellm

    check_not_input(args.output, [args.checkpoint])
    out = export_edgellm(args.checkpoint, args.output, dtype=args.dtype, python=args.edgellm_python)
    print(f"wrote {out}/llm (Edge-LLM model directory, {args.dtype}, DeaMoE plugin nodes; see {out}/deamoe_trt.json)")
    return 0
