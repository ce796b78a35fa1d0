"""`deamoe-trt generate`: prefill a prompt and decode with the KV cache; prints the text and TPOT.

--runtime ort exports the checkpoint in memory and runs that. --onnx FILE runs a model
already exported with `deamoe-trt export-lm` instead: the checkpoint is read for its config
(checked against the file's) and tokenizer only, so the process holds the model once, in
ONNX Runtime (a model too large to hold twice).

Several prompts (--prompt again, or --prompts-file with one a line) decode together on the
runtime's batch decoder: up to --max-sequences at once, a prompt joining as another ends;
each one's text, then a table of each sequence's timings and the batch's tokens/s.
"""

from __future__ import annotations

import argparse

from .. import runtimes
from ..lm.model import TWINS
from . import args as common


def twin_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if text.strip() == "all":
        return list(TWINS)
    bad = [n for n in names if n not in TWINS]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"expected deamoe, expanded, vanilla, a comma-separated list or all, got {text!r}"
        )
    return list(dict.fromkeys(names))


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "generate", help="generate text from a language-model checkpoint and time each token", description=__doc__
    )
    common.add_checkpoint(parser, help="language-model checkpoint directory (e.g. deamoe_trt/lm/data/tiny-lm)")
    parser.add_argument(
        "--prompt",
        action="append",
        default=[],
        help="text to continue (characters the model's tokenizer knows); again for several prompts",
    )
    parser.add_argument(
        "--prompts-file",
        metavar="FILE",
        help="prompts to continue, one a line (blank lines skipped), after any --prompt",
    )
    parser.add_argument(
        "--max-sequences",
        type=common.positive_int,
        default=None,
        help="with several prompts: the most decoded together (default: all of them, up to 256)",
    )
    parser.add_argument(
        "--max-new-tokens", type=common.positive_int, default=200, help="tokens to generate (default 200)"
    )
    decoding = runtimes.names(can="decoding")
    parser.add_argument(
        "--runtime",
        choices=decoding,
        default=None,
        help="the runtime that decodes (default torch): "
        + ", ".join(f"{name} ({runtimes.get(name).label})" for name in decoding),
    )
    parser.add_argument(
        "--onnx",
        metavar="FILE",
        help="run this export of the checkpoint (`deamoe-trt export-lm`) on ONNX Runtime rather than exporting it "
        "again in memory; implies --runtime ort, and --twin must be the one exported",
    )
    parser.add_argument(
        "--twin",
        type=twin_list,
        default=["deamoe"],
        metavar="NAME[,NAME]",
        help="deamoe (default), expanded (same outputs, no sharing), vanilla (one-stage top-k), a list, or all",
    )
    parser.add_argument(
        "--chat", action="store_true", help="wrap the prompt in the model's chat template (Hugging Face tokenizers)"
    )
    parser.add_argument(
        "--temperature",
        type=common.number("a number >= 0", lambda v: 0 <= v < float("inf")),
        default=0.0,
        help="0 (default): greedy; > 0: sample",
    )
    parser.add_argument(
        "--top-k", type=common.non_negative_int, default=0, help="sample among the k most likely tokens (0: all)"
    )
    parser.add_argument(
        "--seed", type=common.seed_value, default=0, help="sampling seed (default 0; greedy ignores it)"
    )
    parser.add_argument(
        "--threads", type=common.thread_count, default=1, help="CPU threads for torch and ONNX Runtime (default 1)"
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..runtimes.text_generation import generate_text

    return generate_text(
        args.checkpoint,
        prompts=args.prompt,
        prompts_file=args.prompts_file,
        max_new_tokens=args.max_new_tokens,
        max_sequences=args.max_sequences,
        runtime=args.runtime,
        onnx=args.onnx,
        twins=args.twin,
        chat=args.chat,
        temperature=args.temperature,
        top_k=args.top_k,
        seed=args.seed,
        threads=args.threads,
    )
