"""`deamoe-trt quantize`: a checkpoint's FFN weights as int8 or int4 with per-group scales.

Takes a layer/stack checkpoint or a whole language-model checkpoint. The departments' shared
parts, the experts' private parts and the shared experts are quantized (round to nearest,
symmetric, ONNX Runtime QMoE's packing); the router and the shared-expert gate stay as they
are, and so do a language model's attention, embeddings, norms, dense MLPs and head. Prints
the quantization error against the input checkpoint on random tokens: relative error of
each DeaMoE layer's output and how many tokens changed experts (none can: the router is not
quantized); for a language model also the held-out perplexity of the input and of the
quantized model, measured in the same run on the same windows.
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
    parser.add_argument("--method", choices=METHODS, default="rtn", help="rtn: round to nearest (default)")
    parser.add_argument(
        "--tokens", type=common.positive_int, default=64, help="random tokens to measure the error on (default 64)"
    )
    common.add_seed(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from ..errors import UsageError
    from ..lm.checkpoint import is_lm_checkpoint
    from ..quant import QuantConfig

    if Path(args.output).resolve() == Path(args.checkpoint).resolve():
        raise UsageError("--output must differ from the input checkpoint (it is read while the output is written)")
    quant = QuantConfig(args.bits, args.group_size, args.method)
    if is_lm_checkpoint(args.checkpoint):
        return _run_lm(args, quant)
    return _run_layers(args, quant)


def _run_layers(args, quant) -> int:
    from ..layer import DeaMoEStack

    stack = DeaMoEStack.from_pretrained(args.checkpoint)
    quantized = stack.quantized(quant)
    path = quantized.save_pretrained(args.output)
    _print_error(args, stack, quantized)
    _print_written(args, f"{len(stack.layers)} layer(s)", path)
    return 0


def _run_lm(args, quant) -> int:
    from ..lm.checkpoint import load_lm, save_lm
    from ..lm.quantize import quantize_lm

    loaded = load_lm(args.checkpoint)
    model = loaded.model
    # A calibrated --method would pass the token ids of its calibration text here.
    quantized = quantize_lm(model, quant)
    blocks = model.moe_layers()
    _print_error(
        args,
        [model.layers[i].mlp for i in blocks],
        [quantized.layers[i].mlp for i in blocks],
        labels=[f"block {i}" for i in blocks],
    )
    record = {"source": str(args.checkpoint), **quant.to_dict()}
    perplexity = _print_perplexity(args.checkpoint, loaded.tokenizer, model, quantized)
    if perplexity is not None:
        record["held_out_perplexity"] = perplexity
    training = {**loaded.training, "quantization": record}
    path = save_lm(quantized, args.output, tokenizer=loaded.tokenizer, training=training)
    _print_written(args, f"{len(blocks)} DeaMoE FFN(s) of {len(model.layers)} block(s)", path)
    return 0


def _print_perplexity(checkpoint, tokenizer, model, quantized) -> dict | None:
    """Print both models' held-out perplexity side by side; return them (None: no tokenizer for the text)."""
    import math

    from ..checkpoint import dtype_name
    from ..lm.quantize import held_out_loss
    from ..lm.train import TEXT_SOURCE
    from ..report import format_table

    q = quantized.config.quantization
    name = f"int{q.bits}, group {q.group_size}"
    print(f"measuring the held-out perplexity of {checkpoint} and of its {name} model ...", flush=True)
    base = held_out_loss(model, tokenizer)
    if base is None:
        print(f"(no held-out perplexity: the model's {tokenizer.describe()} cannot encode the shipped text)")
        return None
    loss = held_out_loss(quantized, tokenizer)
    rows = [
        (label, f"{value:.4f}", f"{math.exp(value):.3f}", f"{math.exp(value - base):.4f}x")
        for label, value in ((f"input ({dtype_name(model.dtype)})", base), (name, loss))
    ]
    title = f"Held-out perplexity (last 10% of {TEXT_SOURCE}; same windows for both)"
    print(format_table(("model", "held-out loss", "perplexity", "vs input"), rows, title=title))
    return {"input": round(math.exp(base), 4), "quantized": round(math.exp(loss), 4)}


def _print_error(args, reference, quantized, labels=None) -> None:
    from ..report import format_table
    from ..summary import quantization_error

    rows = quantization_error(reference, quantized, tokens=args.tokens, seed=args.seed, labels=labels)
    print(
        format_table(
            ("layer", "relative error", "max abs error", "tokens with other experts"),
            rows,
            title=f"Quantization error on {args.tokens} random tokens (vs {args.checkpoint})",
        )
    )


def _print_written(args, what: str, path) -> None:
    from pathlib import Path

    from ..report import format_bytes

    size = sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())
    print(f"wrote {what}, int{args.bits}, group size {args.group_size}, {format_bytes(size)} to {path}")
