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

from dataclasses import dataclass
from typing import Any

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
