"""`deamoe-trt quantize`: a checkpoint's FFN weights as int8 or int4 with per-group scales.

Takes a layer/stack checkpoint or a whole language-model checkpoint. The departments' shared
parts, the experts' private parts and the shared experts are quantized (symmetric, ONNX
Runtime QMoE's packing); the router and the shared-expert gate stay as they are, and so do a
language model's attention, embeddings, norms, dense MLPs and head. A language model
(--method rtn) gets the error table of each DeaMoE FFN on random tokens and the held-out
perplexity of the input and of the quantized model, measured in the same run on the same
windows of the shipped text; with --method awq it calibrates on --calibration TEXTFILE
(default: the shipped text's training part) and prints RTN's and AWQ's error per FFN on
held-out text and the input's, RTN's and AWQ's held-out perplexity. For a layer checkpoint,
--method rtn (default) rounds to nearest and prints the error against the input checkpoint
on random tokens (or on --eval FILE's). --method awq (activation-aware,
docs/quantization.md) chooses channel scales and clipping from --calibration FILE's layer
inputs and prints round to nearest's and its own error on held-out tokens (--eval FILE, or
the last quarter of the calibration tokens, which the search does not see). Both print how
many tokens changed experts (none can: the router is not quantized).

--no-compare skips the error table and the perplexities. A language model's plain round to
nearest (--method rtn, no --linears) is then streamed: each tensor read from the input on
disk, quantized and written in turn, holding one tensor rather than the model (the same
bytes as the in-memory path), so models larger than memory quantize. The measurements,
--method awq and --linears hold the whole model. A language model's --method awq keeps each
finished block's search in OUTPUT.work: a killed run rerun with the same arguments resumes
there (docs/quantization.md).
"""

from __future__ import annotations

from . import args as common


def register(subparsers) -> None:
    from ..quant import BITS, GROUP_SIZES, METHODS

    parser = subparsers.add_parser(
        "quantize", help="quantize a checkpoint's FFN weights to int8 or int4", description=__doc__
    )
    common.add_checkpoint(parser, help="layer/stack or language-model checkpoint directory")
    common.add_output(parser, help="quantized checkpoint directory to write (same kind as the input)", directory=True)
    parser.add_argument("--bits", type=int, required=True, choices=BITS, help="bits per weight: 8 or 4")
    parser.add_argument(
        "--group-size", type=int, default=64, choices=GROUP_SIZES, help="input columns per scale (default 64)"
    )
    parser.add_argument(
        "--method",
        choices=METHODS,
        default="rtn",
        help="rtn: round to nearest (default); awq: activation-aware, needs --calibration",
    )
    parser.add_argument(
        "--calibration",
        metavar="FILE",
        help="--method awq: for a layer checkpoint a safetensors file of layer inputs, 'hidden_states' [T, d] (the "
        "first layer's) or 'layers.{i}.hidden_states' for every layer, or 'random:N' for N Gaussian tokens (a demo); "
        "for a language model a text file (default: the shipped text's training part, never the held-out part)",
    )
    parser.add_argument(
        "--eval",
        metavar="FILE",
        help="held-out layer inputs (same format) to measure the error on; --method awq's default: the last "
        "quarter of the calibration tokens",
    )
    parser.add_argument(
        "--tokens",
        type=common.int_in_range(1, 1 << 20, "a token count"),
        default=64,
        help="--method rtn without --eval: random tokens to measure the error on (default 64)",
    )
    parser.add_argument(
        "--linears",
        default="",
        metavar="PARTS",
        help="language models: also quantize these projections with the same bits and group size, comma-separated "
        "of attention, dense, head (default: the DeaMoE FFNs only); the held-out perplexity of each added part is "
        "printed",
    )
    parser.add_argument(
        "--no-compare",
        action="store_true",
        help="--method rtn: skip the error table and the perplexities; a language model without --linears is then "
        "quantized tensor by tensor from disk (bounded memory), the measurements, awq and --linears hold the model",
    )
    common.add_seed(parser)
    common.add_force(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..quant import QuantConfig
    from ..quantize.run import quantize_checkpoint

    written = quantize_checkpoint(
        args.checkpoint,
        args.output,
        QuantConfig(args.bits, args.group_size, args.method),
        calibration=args.calibration,
        eval=args.eval,
        tokens=args.tokens,
        linears=args.linears,
        compare=not args.no_compare,
        seed=args.seed,
        force=args.force,
        note=common.note,
    )
    print(written)
    return 0
