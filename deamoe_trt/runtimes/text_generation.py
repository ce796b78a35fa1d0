"""The `generate` workflow: prompts continued by a language-model checkpoint on one runtime,
the text printed as it comes and each token timed.

`generate_text` is the one entry point (the command parses its flags and calls it). One
prompt streams its text token by token; several decode together on the runtime's batch
decoder (up to max_sequences at once, a prompt joining as another ends) and each one's text
is printed once the batch is done. With onnx, the export at that path runs on ONNX Runtime
after its config is checked against the checkpoint's, whose weights are never loaded (a
model too large to hold twice).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch

from ..errors import UsageError
from . import get
from .base import MAX_SEQUENCES
from .decode import (
    Sampling,
    batch_table,
    check_prompt,
    generate,
    generate_batch,
    timing_table,
    warm_up,
    warm_up_batch,
)


def generate_text(
    checkpoint: str,
    *,
    prompts: Sequence[str] = (),
    prompts_file: str | None = None,
    max_new_tokens: int = 200,
    max_sequences: int | None = None,
    runtime: str | None = None,
    onnx: str | None = None,
    twins: Sequence[str] = ("deamoe",),
    chat: bool = False,
    temperature: float = 0.0,
    top_k: int = 0,
    seed: int = 0,
    threads: int = 1,
) -> int:
    """Continue the prompts (then the lines of prompts_file) with each of twins in turn on
    runtime (default torch), printing their text and the timing table; 0 when done.

    max_sequences: with several prompts, the most decoded together (default all, up to
    runtime.base.MAX_SEQUENCES). onnx: an export of checkpoint (`export-lm`) run on ONNX
    Runtime instead; twins must then be the one it holds. Bad input raises UsageError."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        run = _Run(
            checkpoint,
            prompts=list(prompts),
            prompts_file=prompts_file,
            max_new_tokens=max_new_tokens,
            max_sequences=max_sequences,
            twins=list(twins),
            chat=chat,
            sampling=Sampling(temperature=temperature, top_k=top_k, seed=seed),  # checked first
            threads=threads,
        )
        if onnx is not None:
            if runtime not in (None, "ort"):
                raise UsageError(f"--onnx runs the file on ONNX Runtime; drop --runtime {runtime} or --onnx")
            return run.from_onnx(Path(onnx))
        return run.from_checkpoint(runtime)
    finally:
        torch.set_num_threads(previous)


class _Run:
    """One call's settings, and the steps every path shares."""

    def __init__(
        self,
        checkpoint: str,
        *,
        prompts: list[str],
        prompts_file: str | None,
        max_new_tokens: int,
        max_sequences: int | None,
        twins: list[str],
        chat: bool,
        sampling: Sampling,
        threads: int,
    ):
        self.checkpoint, self.given, self.prompts_file = checkpoint, prompts, prompts_file
        self.max_new_tokens, self.max_sequences_given = max_new_tokens, max_sequences
        self.twins, self.chat, self.sampling, self.threads = twins, chat, sampling, threads
        self.prompts: list[str] = []

    def from_checkpoint(self, runtime: str | None) -> int:
        from ..lm.checkpoint import load_lm

        if runtime is not None and "gpu" in get(runtime).capabilities.needs:
            reason = get(runtime).available()
            if reason is not None:  # before the checkpoint is read: nothing to run it on
                raise UsageError(f"--runtime {runtime} {reason}")
        self.prompts = self.read_prompts()
        loaded = load_lm(self.checkpoint)
        chosen = get(runtime or "torch")
        if len(self.prompts) > 1:
            batches = (
                (
                    name,
                    lambda name=name: chosen.batch_decoder(
                        loaded.model.twin(name), max_sequences=self.max_sequences(), threads=self.threads
                    ),
                )
                for name in self.twins
            )
            return self.generate_batch(loaded.tokenizer, loaded.model.config, batches)
        prompt, prompt_ids = self.prompt(loaded.tokenizer, loaded.model.config)
        decoders = (
            (name, lambda name=name: chosen.decoder(loaded.model.twin(name), threads=self.threads))
            for name in self.twins
        )
        return self.generate(loaded.tokenizer, prompt, prompt_ids, decoders)

    def from_onnx(self, path: Path) -> int:
        """Decode with the export at path, after checking it is one of the checkpoint."""
        from ..export.lm import lm_export_info
        from ..export.metadata import load_model
        from ..lm.checkpoint import read_lm_header

        header = read_lm_header(self.checkpoint)
        info = lm_export_info(load_model(path), where=str(path), directory=path.parent)  # no weights read yet
        config = header["config"]
        expected = {"deamoe": config, "expanded": config.expanded(), "vanilla": config.vanilla()}[info.twin]
        ours, theirs = expected.to_dict(), info.config.to_dict()
        if ours != theirs:
            field = next(k for k in sorted(set(ours) | set(theirs)) if ours.get(k) != theirs.get(k))
            raise UsageError(
                f"{path} is not an export of {self.checkpoint}: its {field} is {theirs.get(field)!r}, "
                f"the checkpoint's {ours.get(field)!r}"
            )
        if self.twins != [info.twin]:
            raise UsageError(f"{path} holds the {info.twin} model; --twin {','.join(self.twins)} needs its own export")
        tokenizer = header["tokenizer"]
        self.prompts = self.read_prompts()
        ort = get("ort")
        if len(self.prompts) > 1:

            def batch():
                return ort.load_batch_decoder(path, max_sequences=self.max_sequences(), threads=self.threads)

            return self.generate_batch(tokenizer, config, [(info.twin, batch)])
        prompt, prompt_ids = self.prompt(tokenizer, config)
        decoders = [(info.twin, lambda: ort.load_decoder(path, threads=self.threads))]
        return self.generate(tokenizer, prompt, prompt_ids, decoders)

    def read_prompts(self) -> list[str]:
        """Every prompt: the given ones, then the lines of the prompts file; at least one."""
        prompts = list(self.given)
        if self.prompts_file is not None:
            try:
                with open(self.prompts_file, encoding="utf-8") as f:
                    prompts += [line.rstrip("\r\n") for line in f if line.strip()]
            except (OSError, UnicodeDecodeError) as exc:
                raise UsageError(f"cannot read the prompts file {self.prompts_file}: {exc}") from None
        if not prompts:
            raise UsageError("give a prompt: --prompt TEXT (again for several) or --prompts-file FILE")
        return prompts

    def max_sequences(self) -> int:
        """The most sequences decoded together: the one given, else every prompt (up to the maximum)."""
        given = self.max_sequences_given
        if given is not None and given > MAX_SEQUENCES:
            raise UsageError(f"--max-sequences is at most {MAX_SEQUENCES}, got {given}")
        return min(given or MAX_SEQUENCES, len(self.prompts))

    def prompt(self, tokenizer, config, prompt: str | None = None) -> tuple[str, list[int]]:
        """The prompt (the only one unless given; in the chat template with chat) and its token
        ids, checked against the context."""
        prompt = self.prompts[0] if prompt is None else prompt
        if self.chat:
            chat = getattr(tokenizer, "chat", None)
            if chat is None:
                raise UsageError(
                    f"--chat needs a model with a Hugging Face tokenizer; this one has {tokenizer.describe()}"
                )
            prompt = chat(prompt)
        prompt_ids = tokenizer.encode(prompt)
        check_prompt(prompt_ids, config.max_position_embeddings)
        return prompt, prompt_ids

    def generate(self, tokenizer, prompt: str, prompt_ids: list[int], decoders: Iterable[tuple[str, Callable]]) -> int:
        """Generate with each (model name, decoder factory) in turn: the text as it comes, then the table."""
        sampling = self.sampling
        results = []
        for name, make in decoders:
            decoder = make()
            warm_up(decoder, prompt_ids)
            print(f"--- {name} on {decoder.name}, {sampling.describe()}")
            stream = _Stream(tokenizer, prompt)
            result = generate(
                decoder, prompt_ids, self.max_new_tokens, sampling=sampling, model=name, on_token=stream.token
            )
            results.append(result)
            same = [r.model for r in results[:-1] if r.new_ids == result.new_ids]
            print(f"\n(same tokens as {same[0]})" if same else "")
            if result.stopped == "context":
                print(f"(stopped after {len(result.new_ids)} tokens: the context of {decoder.max_context} is full)")
            print()
        print(timing_table(results))
        return 0

    def generate_batch(self, tokenizer, config, batches: Iterable[tuple[str, Callable]]) -> int:
        """Decode every prompt together with each (model name, batch decoder factory) in turn:
        each prompt's text once the batch is done, then the table."""
        prompts = [self.prompt(tokenizer, config, p) for p in self.prompts]
        sampling, limit = self.sampling, self.max_sequences()
        tables = []
        for name, make in batches:
            batch = make()
            warm_up_batch(batch, prompts[0][1], limit)
            print(f"--- {name} on {batch.name}, {sampling.describe()}, {len(prompts)} prompts, {limit} at most at once")
            run = generate_batch(batch, [ids for _, ids in prompts], self.max_new_tokens, sampling=sampling, model=name)
            for i, ((text, _), result) in enumerate(zip(prompts, run.results, strict=True)):
                note = " (stopped: the context is full)" if result.stopped == "context" else ""
                print(f"[{i}] {text}{tokenizer.decode(result.new_ids)}{note}")
            print()
            tables.append(batch_table(run))
        print("\n\n".join(tables))
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
