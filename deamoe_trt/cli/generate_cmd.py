"""`deamoe-trt generate`: prefill a prompt and decode with the KV cache; prints the text and TPOT."""

from __future__ import annotations

import argparse

from . import args as common

TWINS = ("deamoe", "expanded", "vanilla")
RUNTIMES = ("torch", "ort", "cpu")


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
    parser.add_argument("--prompt", required=True, help="text to continue (characters the model's tokenizer knows)")
    parser.add_argument(
        "--max-new-tokens", type=common.positive_int, default=200, help="tokens to generate (default 200)"
    )
    parser.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default="torch",
        help="torch (reference), ort (ONNX Runtime CPU) or cpu (FFNs on deamoe-trt's CPU kernel)",
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
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; > 0: sample")
    parser.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0: all)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0; greedy ignores it)")
    parser.add_argument(
        "--threads", type=common.positive_int, default=1, help="CPU threads for torch and ONNX Runtime (default 1)"
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
    from ..lm.generate import Sampling, check_prompt, generate, timing_table, warm_up

    sampling = Sampling(temperature=args.temperature, top_k=args.top_k, seed=args.seed)
    loaded = load_lm(args.checkpoint)
    prompt = args.prompt
    if args.chat:
        chat = getattr(loaded.tokenizer, "chat", None)
        if chat is None:
            raise UsageError(
                f"--chat needs a model with a Hugging Face tokenizer; this one has {loaded.tokenizer.describe()}"
            )
        prompt = chat(prompt)
    prompt_ids = loaded.tokenizer.encode(prompt)
    check_prompt(prompt_ids, loaded.model.config.max_position_embeddings)
    results = []
    for name in args.twin:
        model = loaded.model.twin(name)
        decoder = _decoder(args.runtime, model, args.threads)
        warm_up(decoder, prompt_ids)
        print(f"--- {name} on {decoder.name}, {sampling.describe()}")
        stream = _Stream(loaded.tokenizer, prompt)
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
        self.tokenizer, self.ids, self.shown = tokenizer, [], ""
        print(prompt, end="", flush=True)

    def token(self, token: int) -> None:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.startswith(self.shown) and not text.endswith("\ufffd"):
            print(text[len(self.shown) :], end="", flush=True)
            self.shown = text


def _decoder(runtime: str, model, threads: int):
    from .. import runtimes

    return runtimes.get(runtime).decoder(model, threads=threads)
