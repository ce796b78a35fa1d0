"""Writes that leave either the whole new file or nothing: temporary file, then rename."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import UsageError, one_line


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside target; rename it onto target only if the block succeeds."""
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:  # read-only place, a file where a folder should be, no space...
        raise UsageError(f"cannot write {target}: {one_line(exc)}") from None
    os.close(fd)
    tmp_path = Path(tmp)
    # mkstemp makes the file private (0600); give it the mode a plain open() would.
    umask = os.umask(0)
    os.umask(umask)
    tmp_path.chmod(0o666 & ~umask)
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    finally:
        tmp_path.unlink(missing_ok=True)


def check_writable(target: str | Path, *, directory: bool = False) -> Path:
    """target, if a file (or, with directory, files inside it) can be written there: the
    folder exists and is writable, or can be made inside a writable one. A one-line
    UsageError naming the obstacle otherwise. For commands to call before their work."""
    target = Path(target)
    if directory and target.exists() and not target.is_dir():
        raise UsageError(f"cannot write into {target}: it is a file, not a directory")
    if not directory and target.is_dir():
        raise UsageError(f"cannot write {target}: it is a directory; give a file name")
    # The folder the files go into, or its nearest ancestor that exists: it must be writable.
    folder = target if directory else target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise UsageError(f"cannot write {target}: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {target}: {folder} is not writable")
    return target


def read_json(path: Path, error: type[UsageError] = UsageError):
    """The JSON document at path; `error` with one line saying why when it is not valid JSON."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{path} is not valid JSON: {exc}") from None


def atomic_write_text(target: str | Path, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text)


@contextlib.contextmanager
def staged_folder(folder: str | Path, what: str, last: str) -> Iterator[Path]:
    """Yield a temporary folder beside folder to write into; when the block succeeds, move its
    files into folder one by one, `last` last (a reader that looks for it finds the others
    already there). An OSError ends in one line; the temporary folder never stays."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"cannot write {what} {folder}: a file is in the way")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    except OSError as exc:
        raise UsageError(f"cannot write {folder}: {one_line(exc)}") from None
    try:
        yield staging
        folder.mkdir(exist_ok=True)
        for name in sorted(sorted(p.name for p in staging.iterdir()), key=lambda n: n == last):
            os.replace(staging / name, folder / name)
    except OSError as exc:
        raise UsageError(f"cannot write {folder}: {one_line(exc)}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
