"""Calibration and healing data for a language model from files: `convert --data PATH`.

Formats, by the name's ending: `.jsonl` (one JSON object a line, its "text" string),
`.parquet` (its "text" column; needs pyarrow), anything else a UTF-8 text (one document).
A folder: every such file in it, in name order. Documents are encoded one by one with the
model's tokenizer, joined by a blank line, until the token budget is met; the last
`heldout_fraction` of the tokens (by position, so the two parts share no token) is held out
for every reported number, the rest calibrates and heals.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import MissingDependencyError, UsageError

SEPARATOR = "\n\n"
SUFFIXES = (".txt", ".jsonl", ".parquet")


@dataclass
class TokenData:
    """Token ids read from files, and where the held-out part starts."""

    ids: torch.Tensor  # [T] int64
    heldout_start: int
    summary: dict


def format_of(path: Path) -> str:
    return {".jsonl": "jsonl", ".parquet": "parquet"}.get(path.suffix.lower(), "text")


def files_of(path: str | Path) -> list[Path]:
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in SUFFIXES)
        if not files:
            raise UsageError(f"data folder {path} has no {', '.join(SUFFIXES)} files")
        return files
    if not path.is_file():
        raise UsageError(f"data {path} does not exist")
    return [path]


def documents(path: Path) -> Iterator[str]:
    """The texts of one file, in order; a one-line UsageError for anything unreadable."""
    if path.stat().st_size == 0:
        raise UsageError(f"data file {path} is empty")
    kind = format_of(path)
    if kind == "parquet":
        yield from _parquet_texts(path)
        return
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"data file {path} is not UTF-8: {exc.reason} at byte {exc.start}") from None
    if kind == "text":
        yield text
        return
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"data file {path} line {number} is not JSON: {exc.msg}") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise UsageError(f'data file {path} line {number} has no "text" string')
        yield record["text"]


def _parquet_texts(path: Path) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingDependencyError(
            f"reading {path} needs pyarrow (pip install 'deamoe-trt[data]' or pip install pyarrow)"
        ) from None
    try:
        table = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow's errors: not a parquet file, truncated, ...
        raise UsageError(f"data file {path} is not a readable parquet file: {exc}") from None
    if "text" not in table.schema_arrow.names:
        raise UsageError(f'data file {path} has no "text" column (columns: {", ".join(table.schema_arrow.names)})')
    for batch in table.iter_batches(columns=["text"]):
        for value in batch.column(0).to_pylist():
            if value is not None:
                if not isinstance(value, str):
                    raise UsageError(f'data file {path} has a "text" column of {type(value).__name__}, not strings')
                yield value


def read_tokens(
    path: str | Path,
    tokenizer,
    *,
    budget: int | None = None,
    heldout_fraction: float = 0.1,
    window: int,
) -> TokenData:
    """The first `budget` tokens (all if None) of the data at path, split by position.

    window: tokens per calibration/held-out window; the held-out part needs at least one,
    the calibration part at least two."""
    if not 0 < heldout_fraction < 1:
        raise UsageError(f"the held-out fraction must be in (0, 1), got {heldout_fraction}")
    files = files_of(path)
    ids: list[int] = []
    count = 0
    for file in files:
        for text in documents(file):
            if not text.strip():
                continue
            if ids:
                ids += tokenizer.encode(SEPARATOR, what=f"the separator between documents of {file}")
            ids += tokenizer.encode(text, what=f"document {count + 1} of {file}")
            count += 1
            if budget is not None and len(ids) >= budget:
                break
        if budget is not None and len(ids) >= budget:
            break
    if not count:
        raise UsageError(f"data {path} has no text")
    ids = ids[:budget] if budget is not None else ids
    start = int(len(ids) * (1 - heldout_fraction))
    held = len(ids) - start
    need = max(math.ceil(2 * window / (1 - heldout_fraction)), math.ceil(window / heldout_fraction)) + 1
    if start < 2 * window or held < window:
        raise UsageError(
            f"data {path} has too few tokens: {len(ids)}{' within the budget' if budget else ''}; "
            f"a held-out fraction of {heldout_fraction:g} with windows of {window} tokens needs at least {need}"
        )
    summary = {
        "path": str(path),
        "files": len(files),
        "format": sorted({format_of(f) for f in files}),
        "documents": count,
        "tokens": len(ids),
        "budget": budget,
        "calibration_tokens": [0, start],
        "heldout_tokens": [start, len(ids)],
    }
    return TokenData(ids=torch.tensor(ids, dtype=torch.long), heldout_start=start, summary=summary)
