"""Byte-level tokenizer: token id = UTF-8 byte value, no merges, no special tokens.

Bytes make the tokenizer trivial to reproduce in any runtime (the C++ sample does it in
three lines) and need no vocabulary file. A checkpoint records the characters its model
was trained on (its *alphabet*); the shipped tiny-lm knows newline and printable ASCII.

Characters outside the alphabet are rejected, naming the character and its position,
rather than mapped to an unknown token: this model has no unknown token to map to, an
embedding the model never trained on makes it continue with noise, and a user who pasted
a curly quote wants to hear about it, not to get gibberish back. Generated ids are
decoded leniently (ids outside the alphabet become U+FFFD) since a sampler can emit any id.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._io import atomic_path
from ..errors import UsageError

PRINTABLE_ASCII = "\n" + "".join(chr(c) for c in range(0x20, 0x7F))

# What people paste most often, and the ASCII the tiny model knows instead.
_ASCII_HINTS = {
    "\u2018": "'",
    "\u2019": "'",
    "\u201c": '"',
    "\u201d": '"',
    "\u2013": "-",
    "\u2014": "--",
    "\u2026": "...",
    "\u00a0": " ",
    "\t": " ",
    "\r": "",
}


@dataclass(frozen=True)
class ByteTokenizer:
    alphabet: str = PRINTABLE_ASCII
    vocab_size: int = 256

    def __post_init__(self) -> None:
        if not self.alphabet:
            raise UsageError("tokenizer alphabet is empty")
        if self.vocab_size < 256:
            raise UsageError(f"a byte tokenizer needs vocab_size >= 256, got {self.vocab_size}")
        if any(ord(c) > 0x7F for c in self.alphabet):
            raise UsageError("a byte tokenizer's alphabet must be ASCII (one byte per character)")

    def encode(self, text: str, *, what: str = "the prompt") -> list[int]:
        """Token ids of text; a UsageError naming the first character outside the alphabet."""
        known = set(self.alphabet)
        for position, char in enumerate(text):
            if char not in known:
                raise UsageError(self._unknown_message(char, position, what))
        return list(text.encode("ascii"))

    def decode(self, ids: list[int]) -> str:
        """Text of ids; an id outside the alphabet (a control byte, a byte the model never
        trained on, an id past 255) becomes U+FFFD, so no generated id reaches a terminal
        as an escape sequence."""
        known = {ord(c) for c in self.alphabet}
        return "".join(chr(i) if i in known else "\ufffd" for i in ids)

    def _unknown_message(self, char: str, position: int, what: str) -> str:
        described = {"\n": "newline", "\t": "tab", "\r": "carriage return"}.get(char, repr(char))
        message = (
            f"{what} has {described} (U+{ord(char):04X}) at character {position + 1}, which this model's "
            f"byte tokenizer does not know; it knows {self.describe()}"
        )
        hint = _ASCII_HINTS.get(char)
        if hint is not None:
            message += f" (write {hint!r} instead)" if hint else " (remove it)"
        return message

    def describe(self) -> str:
        if self.alphabet == PRINTABLE_ASCII:
            return "newline and printable ASCII (space to '~')"
        return f"{len(self.alphabet)} characters: {self.alphabet!r}"

    # JSON -------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {"type": "bytes", "vocab_size": self.vocab_size, "alphabet": self.alphabet}

    @classmethod
    def from_dict(cls, data: Any) -> ByteTokenizer:
        if not isinstance(data, dict) or data.get("type") != "bytes":
            raise UsageError(f'tokenizer must be {{"type": "bytes", ...}}, got {data!r:.80}')
        alphabet, vocab = data.get("alphabet"), data.get("vocab_size", 256)
        if not isinstance(alphabet, str) or not isinstance(vocab, int) or isinstance(vocab, bool):
            raise UsageError("tokenizer needs a string alphabet and an integer vocab_size")
        return cls(alphabet=alphabet, vocab_size=vocab)


class HFTokenizer:
    """A Hugging Face tokenizer.json read with the `tokenizers` library (no transformers, no
    code from the model directory), with the chat template of tokenizer_config.json when asked.

    Checkpoints and ONNX exports record {"type": "hf", "file": "tokenizer.json"} and keep the
    files beside the weights (HF_FILES), so the tokenizer travels with the model.
    """

    FILE = "tokenizer.json"

    def __init__(self, directory: str | Path, vocab_size: int):
        from tokenizers import Tokenizer

        self.directory = Path(directory)
        self.vocab_size = vocab_size
        path = self.directory / self.FILE
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises its own Exception subclass
            raise UsageError(f"{path} is not a readable tokenizer.json: {' '.join(str(exc).split())[:200]}") from None
        self.settings: dict[str, Any] = {}
        settings = self.directory / "tokenizer_config.json"
        if settings.is_file():
            try:
                loaded = json.loads(settings.read_text())
                self.settings = loaded if isinstance(loaded, dict) else {}
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise UsageError(f"{settings} is not valid JSON: {exc}") from None

    def encode(self, text: str, *, what: str = "the prompt") -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=True).ids
        if not ids:
            raise UsageError(f"{what} encodes to no tokens")
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def describe(self) -> str:
        return f"Hugging Face tokenizer ({self.tokenizer.get_vocab_size()} tokens)"

    def chat(self, user: str) -> str:
        """user's message in the model's chat template, ready for the assistant's reply."""
        template = self.settings.get("chat_template")
        if template is None and (self.directory / "chat_template.jinja").is_file():  # transformers 5 keeps it there
            template = (self.directory / "chat_template.jinja").read_text()
        if isinstance(template, list):  # named templates: use "default"
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        if not isinstance(template, str):
            raise UsageError(f"{self.directory} has no chat template (tokenizer_config.json chat_template)")
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise UsageError(f"the chat template refused the prompt: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        special = {k: v for k, v in self.settings.items() if k.endswith("_token") and isinstance(v, str)}
        try:
            return env.from_string(template).render(
                messages=[{"role": "user", "content": user}], add_generation_prompt=True, **special
            )
        except jinja2.TemplateError as exc:
            raise UsageError(f"the chat template of {self.directory} failed: {exc}") from None

    def eos_ids(self) -> list[int]:
        """Token ids that end a reply (tokenizer_config.json's eos_token, when the vocabulary has it)."""
        token = self.settings.get("eos_token")
        if isinstance(token, dict):
            token = token.get("content")
        found = self.tokenizer.token_to_id(token) if isinstance(token, str) else None
        return [] if found is None else [found]

    def to_dict(self) -> dict[str, Any]:
        return {"type": "hf", "file": self.FILE, "vocab_size": self.vocab_size}

    def save(self, directory: str | Path) -> dict[str, Any]:
        """Copy the tokenizer files into directory (atomically each); returns to_dict()."""
        for name in HF_FILES:
            source = self.directory / name
            if source.is_file() and source.resolve() != (Path(directory) / name).resolve():
                with atomic_path(Path(directory) / name) as tmp:
                    shutil.copyfile(source, tmp)
        return self.to_dict()


class NoTokenizer:
    """A model imported without tokenizer.json: it decodes ids, and says so when given text."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str, *, what: str = "the prompt") -> list[int]:
        raise UsageError(
            "this model has no tokenizer (its Hugging Face directory had no tokenizer.json); "
            "import it again from a directory with one"
        )

    def decode(self, ids: list[int]) -> str:
        return " ".join(str(i) for i in ids)

    def describe(self) -> str:
        return "no tokenizer"

    def to_dict(self) -> dict[str, Any]:
        return {"type": "none", "vocab_size": self.vocab_size}


# chat_template.jinja: where transformers 5 saves the chat template; generation_config.json:
# the stop tokens runtimes such as Edge-LLM read beside the tokenizer.
HF_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)
Tokenizer = ByteTokenizer | HFTokenizer | NoTokenizer


def byte_level_tokenizer_json(tokenizer: ByteTokenizer) -> dict:
    """tokenizer.json (Hugging Face `tokenizers` format) that maps each byte to its own id."""
    table = _bytes_to_unicode()
    vocab = {table[i]: i for i in range(256)}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }


def write_tokenizer(tokenizer: Tokenizer, folder: Path, *, chat_template: str | None = None) -> int | None:
    """The tokenizer files into folder; returns the end-of-text id (None: the byte tokenizer's
    models have none, so generation runs to its length limit). chat_template: the byte
    tokenizer's, for servers that apply one (a Hugging Face tokenizer keeps its own)."""
    if isinstance(tokenizer, NoTokenizer):
        return None
    if isinstance(tokenizer, HFTokenizer):
        tokenizer.save(folder)
        eos = tokenizer.eos_ids()
        return eos[0] if eos else None
    assert isinstance(tokenizer, ByteTokenizer)
    (folder / "tokenizer.json").write_text(json.dumps(byte_level_tokenizer_json(tokenizer)))
    settings: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_prefix_space": False,
        "model_max_length": 10**6,
    }
    if chat_template is not None:
        settings["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    return None


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-to-character table: printable bytes stand for themselves, the rest are
    shifted past 255 so every byte has a visible, whitespace-free character."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    table, shifted = {}, 0
    for byte in range(256):
        if byte in keep:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + shifted)
            shifted += 1
    return table


def hf_tokenizer_from_dir(directory: str | Path, vocab_size: int) -> HFTokenizer | None:
    """The tokenizer of a Hugging Face model directory, or None when it has no tokenizer.json."""
    if not (Path(directory) / HFTokenizer.FILE).is_file():
        return None
    return HFTokenizer(directory, vocab_size)


def default_tokenizer(vocab_size: int) -> Tokenizer:
    """What a model saved without a tokenizer gets: bytes when its vocabulary holds them."""
    return ByteTokenizer(vocab_size=vocab_size) if vocab_size >= 256 else NoTokenizer(vocab_size)


def tokenizer_from_dict(data: Any, directory: str | Path | None = None) -> Tokenizer:
    """The tokenizer a checkpoint's or an export's metadata describes; "hf" reads its files
    from directory."""
    kind = data.get("type") if isinstance(data, dict) else None
    if kind == "hf":
        vocab = data.get("vocab_size")
        if directory is None or not (Path(directory) / HFTokenizer.FILE).is_file():
            raise UsageError(f"the model's tokenizer.json is missing (expected beside it in {directory})")
        return HFTokenizer(directory, vocab)
    if kind == "none":
        return NoTokenizer(data.get("vocab_size"))
    return ByteTokenizer.from_dict(data)
