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
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def _run(args) -> int:
    from ..errors import UsageError
    from ..lm.checkpoint import load_lm
    from ..runtimes.decode import Sampling

    args.sampling = Sampling(temperature=args.temperature, top_k=args.top_k, seed=args.seed)  # checked first
    if args.onnx is not None:
        if args.runtime not in (None, "ort"):
            raise UsageError(f"--onnx runs the file on ONNX Runtime; drop --runtime {args.runtime} or --onnx")
        return _run_onnx(args)
    if args.runtime is not None and "gpu" in runtimes.get(args.runtime).capabilities.needs:
        reason = runtimes.get(args.runtime).available()
        if reason is not None:  # before the checkpoint is read: nothing to run it on
            raise UsageError(f"--runtime {args.runtime} {reason}")
    args.prompts = _prompts(args)
    loaded = load_lm(args.checkpoint)
    if len(args.prompts) > 1:
        runtime = args.runtime or "torch"
        batches = (
            (name, lambda name=name: _batch_decoder(runtime, loaded.model.twin(name), args)) for name in args.twin
        )
        return _generate_batch(args, loaded.tokenizer, loaded.model.config, batches)
    prompt, prompt_ids = _prompt(args, loaded.tokenizer, loaded.model.config)
    decoders = (
        (name, lambda name=name: _decoder(args.runtime or "torch", loaded.model.twin(name), args.threads))
        for name in args.twin
    )
    return _generate(args, loaded.tokenizer, prompt, prompt_ids, decoders)


def _run_onnx(args) -> int:
    """Decode with the export at args.onnx, after checking it is one of args.checkpoint."""
    from pathlib import Path

    from ..errors import UsageError
    from ..export.lm import lm_export_info
    from ..export.metadata import load_model
    from ..lm.checkpoint import read_lm_header

    header = read_lm_header(args.checkpoint)
    path = Path(args.onnx)
    info = lm_export_info(load_model(path), where=str(path), directory=path.parent)  # no weights read yet
    config = header["config"]
    expected = {"deamoe": config, "expanded": config.expanded(), "vanilla": config.vanilla()}[info.twin]
    ours, theirs = expected.to_dict(), info.config.to_dict()
    if ours != theirs:
        field = next(k for k in sorted(set(ours) | set(theirs)) if ours.get(k) != theirs.get(k))
        raise UsageError(
            f"{path} is not an export of {args.checkpoint}: its {field} is {theirs.get(field)!r}, "
            f"the checkpoint's {ours.get(field)!r}"
        )
    if args.twin != [info.twin]:
        raise UsageError(f"{path} holds the {info.twin} model; --twin {','.join(args.twin)} needs its own export")
    tokenizer = header["tokenizer"]
    args.prompts = _prompts(args)
    ort = runtimes.get("ort")
    if len(args.prompts) > 1:

        def batch():
            return ort.load_batch_decoder(path, max_sequences=_max_sequences(args), threads=args.threads)

        return _generate_batch(args, tokenizer, config, [(info.twin, batch)])
    prompt, prompt_ids = _prompt(args, tokenizer, config)
    decoders = [(info.twin, lambda: ort.load_decoder(path, threads=args.threads))]
    return _generate(args, tokenizer, prompt, prompt_ids, decoders)


def _prompts(args) -> list[str]:
    """Every prompt: the --prompt ones, then the lines of --prompts-file; at least one."""
    from ..errors import UsageError

    prompts = list(args.prompt)
    if args.prompts_file is not None:
        try:
            with open(args.prompts_file, encoding="utf-8") as f:
                prompts += [line.rstrip("\r\n") for line in f if line.strip()]
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read the prompts file {args.prompts_file}: {exc}") from None
    if not prompts:
        raise UsageError("give a prompt: --prompt TEXT (again for several) or --prompts-file FILE")
    return prompts


def _max_sequences(args) -> int:
    """The most sequences decoded together: --max-sequences, else every prompt (up to the maximum)."""
    from ..errors import UsageError
    from ..runtimes.base import MAX_SEQUENCES

    if args.max_sequences is not None and args.max_sequences > MAX_SEQUENCES:
        raise UsageError(f"--max-sequences is at most {MAX_SEQUENCES}, got {args.max_sequences}")
    return min(args.max_sequences or MAX_SEQUENCES, len(args.prompts))


def _prompt(args, tokenizer, config, prompt: str | None = None) -> tuple[str, list[int]]:
    """The prompt (args' only one unless given; in the chat template with --chat) and its
    token ids, checked against the context."""
    from ..errors import UsageError
    from ..runtimes.decode import check_prompt

    prompt = args.prompts[0] if prompt is None else prompt
    if args.chat:
        chat = getattr(tokenizer, "chat", None)
        if chat is None:
            raise UsageError(f"--chat needs a model with a Hugging Face tokenizer; this one has {tokenizer.describe()}")
        prompt = chat(prompt)
    prompt_ids = tokenizer.encode(prompt)
    check_prompt(prompt_ids, config.max_position_embeddings)
    return prompt, prompt_ids


def _generate(args, tokenizer, prompt: str, prompt_ids: list[int], decoders) -> int:
    """Generate with each (model name, decoder factory) in turn: the text as it comes, then the table."""
    from ..runtimes.decode import generate, timing_table, warm_up

    sampling = args.sampling
    results = []
    for name, make in decoders:
        decoder = make()
        warm_up(decoder, prompt_ids)
        print(f"--- {name} on {decoder.name}, {sampling.describe()}")
        stream = _Stream(tokenizer, prompt)
        result = generate(
            decoder, prompt_ids, args.max_new_tokens, sampling=sampling, model=name, on_token=stream.token
        )
        results.append(result)
        same = [r.model for r in results[:-1] if r.new_ids == result.new_ids]
        print(f"\n(same tokens as {same[0]})" if same else "")
        if result.stopped == "context":
            print(f"(stopped after {len(result.new_ids)} tokens: the context of {decoder.max_context} is full)")
        print()
    print(timing_table(results))
    return 0


class _Stream:
    """Prints the prompt, then each token's text as it is generated (the text of all new ids
    so far, less what is already on screen: a token may complete a multi-byte character)."""

    def __init__(self, tokenizer, prompt: str):
        self.tokenizer, self.shown = tokenizer, ""
        self.ids: list[int] = []
        print(prompt, end="", flush=True)

    def token(self, token: int) -> None:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.startswith(self.shown) and not text.endswith("\ufffd"):
            print(text[len(self.shown) :], end="", flush=True)
            self.shown = text


def _generate_batch(args, tokenizer, config, batches) -> int:
    """Decode every prompt together with each (model name, batch decoder factory) in turn:
    each prompt's text once the batch is done, then the table."""
    from ..runtimes.decode import batch_table, generate_batch, warm_up_batch

    prompts = [_prompt(args, tokenizer, config, p) for p in args.prompts]
    sampling, limit = args.sampling, _max_sequences(args)
    tables = []
    for name, make in batches:
        batch = make()
        warm_up_batch(batch, prompts[0][1], limit)
        print(f"--- {name} on {batch.name}, {sampling.describe()}, {len(prompts)} prompts, {limit} at most at once")
        run = generate_batch(batch, [ids for _, ids in prompts], args.max_new_tokens, sampling=sampling, model=name)
        for i, ((text, _), result) in enumerate(zip(prompts, run.results, strict=True)):
            note = " (stopped: the context is full)" if result.stopped == "context" else ""
            print(f"[{i}] {text}{tokenizer.decode(result.new_ids)}{note}")
        print()
        tables.append(batch_table(run))
    print("\n\n".join(tables))
    return 0


def _batch_decoder(runtime: str, model, args):
    return runtimes.get(runtime).batch_decoder(model, max_sequences=_max_sequences(args), threads=args.threads)


def _decoder(runtime: str, model, threads: int):
    return runtimes.get(runtime).decoder(model, threads=threads)
