"""Extract one novel from the janeaustenr R package's data without R (how persuasion.txt was made).

Usage: python extract_janeaustenr.py PREFIX NAME OUT
  PREFIX: path of the lazy-load database without extension (.../janeaustenr/data/Rdata)
  NAME:   persuasion, emma, mansfieldpark, northangerabbey, prideprejudice or sensesensibility
  OUT:    text file to write (lines joined with newlines, final newline added)

Reads R's lazy-load format: PREFIX.rdx is a compressed serialized index of
(offset, length) per variable; each PREFIX.rdb record is a 4-byte length and a zlib
stream holding one object in R's XDR serialization. Only the types this data uses are
understood (character vectors, pair lists, a few scalars); anything else is an error.
"""

from __future__ import annotations

import gzip
import struct
import sys
import zlib


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0
        self.refs: list[tuple[str, object]] = []

    def take(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def int(self) -> int:
        return struct.unpack(">i", self.take(4))[0]

    def header(self) -> None:
        if self.take(2) != b"X\n":
            raise ValueError("not R XDR serialization")
        version = self.int()
        self.int(), self.int()
        if version == 3:
            self.take(self.int())  # native encoding name

    def item(self):
        flags = self.int()
        kind = flags & 0xFF
        has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
        if kind in (254, 242, 251):  # NULL, empty env, missing arg
            return None
        if kind == 255:  # reference to an earlier symbol
            index = flags >> 8 or self.int()
            return self.refs[index - 1]
        if kind == 1:  # symbol
            symbol = ("symbol", self.item())
            self.refs.append(symbol)
            return symbol
        if kind == 2:  # pair list: [(tag, value), ...]
            if has_attr:
                self.item()
            tag = self.item() if has_tag else None
            head, tail = self.item(), self.item()
            return [(tag, head)] + (tail if isinstance(tail, list) else [])
        if kind == 9:  # CHARSXP
            n = self.int()
            return None if n == -1 else self.take(n).decode("utf-8")
        if kind in (10, 13):  # logical, integer
            values = [self.int() for _ in range(self.int())]
        elif kind == 14:  # double
            values = [struct.unpack(">d", self.take(8))[0] for _ in range(self.int())]
        elif kind in (16, 19):  # character vector, list
            values = [self.item() for _ in range(self.int())]
        else:
            raise ValueError(f"R type {kind} is not understood by this extractor")
        if has_attr:
            attrs = self.item()
            names = [value for tag, value in attrs if tag and tag[1] == "names"]
            if names and kind == 19:
                return dict(zip(names[0], values, strict=True))
        return values


def load(prefix: str) -> dict:
    with open(prefix + ".rdx", "rb") as f:
        raw = f.read()
    index = _Reader(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else zlib.decompress(raw[4:]))
    index.header()
    variables = index.item()["variables"]
    with open(prefix + ".rdb", "rb") as f:
        database = f.read()
    out = {}
    for name, (offset, length) in variables.items():
        record = _Reader(zlib.decompress(database[int(offset) + 4 : int(offset) + int(length)]))
        record.header()
        out[name] = record.item()
    return out


def main(argv: list[str]) -> int:
    prefix, name, out = argv
    lines = load(prefix)[name]
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(line or "" for line in lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
