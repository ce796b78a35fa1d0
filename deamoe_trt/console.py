"""Plain-text tables, byte counts and progress lines on the console, shared by every command."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence


def format_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    title: str | None = None,
    align: str | None = None,
    markdown: bool = False,
) -> str:
    """Cells already formatted as the caller wants. align: one letter per column, "l" or "r";
    default the first column left (names), the others right (numbers). markdown: a Markdown
    table (the title a paragraph above it) instead of aligned text."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    align = align or "l" + "r" * (len(headers) - 1)
    if len(align) != len(headers) or set(align) - {"l", "r"}:
        raise ValueError(f"align needs one of 'l'/'r' per column ({len(headers)}), got {align!r}")
    if markdown:
        rule = ["---" if a == "l" else "---:" for a in align]
        lines = ["| " + " | ".join(row) + " |" for row in (cells[0], rule, *cells[1:])]
        return "\n".join(([title, ""] if title else []) + lines)

    def line(row: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(row, widths, align, strict=True)
        ).rstrip()

    out = [title] if title else []
    out += [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(row) for row in cells[1:]]
    return "\n".join(out)


def format_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


class Progress:
    """Progress on stderr: one rewritten line on a terminal; in a log, the first and last
    steps and at most one line every `log_interval` seconds between them.

    Work that takes more than a few seconds reports through this, so CI logs and
    terminals both show where a long run is, without a line per step in the log."""

    def __init__(self, total: int, label: str, *, stream=None, enabled: bool = True, log_interval: float = 5.0):
        self.total, self.label, self.done = total, label, 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.start = time.perf_counter()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.log_interval = log_interval
        self.last_logged: float | None = None

    def update(self, message: str = "", step: int = 1) -> None:
        self.done += step
        if not self.enabled:
            return
        now = time.perf_counter()
        text = f"{self.label} [{self.done}/{self.total}] {now - self.start:6.1f}s {message}"
        finished = self.done >= self.total
        if self.tty:
            self.stream.write("\r\033[K" + text + ("\n" if finished else ""))
        elif finished or self.last_logged is None or now - self.last_logged >= self.log_interval:
            self.stream.write(text + "\n")
            self.last_logged = now
        else:
            return
        self.stream.flush()
