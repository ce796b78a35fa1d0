"""The one helper that turns an exception into the one line the CLI prints."""

from __future__ import annotations

from deamoe_trt.errors import one_line


def test_one_line_joins_whitespace_and_names_the_type_when_empty():
    assert one_line(ValueError("bad\n  thing\there")) == "bad thing here"
    assert one_line(ValueError("")) == "ValueError"
    assert one_line(ValueError("  \n ")) == "ValueError"


def test_first_line_and_limit():
    assert one_line(OSError("cannot open x\nTraceback ...\n  more"), first=True) == "cannot open x"
    assert one_line(RuntimeError("abcdef"), limit=3) == "abc"
    assert one_line(RuntimeError("\n"), first=True, limit=3) == "RuntimeError"
