"""Writes that leave either the whole new file or nothing: temporary file, then rename.

Every writer follows one discipline: an output is checked before any work (writable, names
within the system's limits, not an input, not holding one, not inside one); temporaries live
beside the output as `.NAME.deamoe-PID-XXXX.tmp`, removed when the write fails or is
interrupted and swept by the next run once their process is gone; files get the mode the
umask gives a plain open().
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from .errors import UsageError, one_line

# The mark of this tool's temporaries: `.NAME.deamoe-PID-RANDOM.tmp`.
_TEMP_MARK = re.compile(r"^\.(?P<name>.+)\.deamoe-(?P<pid>\d+)-[A-Za-z0-9_]+\.tmp$")


def _temp_prefix(name: str) -> str:
    return f".{name}.deamoe-{os.getpid()}-"


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's live process
        return True
    return True


def sweep_temporaries(folder: str | Path, name: str | None = None) -> list[Path]:
    """Remove this tool's temporaries in folder (for `name` only, if given) whose process is
    gone: what a killed run left. A live writer's are kept. The paths removed."""
    folder = Path(folder)
    removed: list[Path] = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _TEMP_MARK.match(entry.name)
        if not match or (name is not None and match["name"] != name) or _alive(int(match["pid"])):
            continue
        try:
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        except OSError:
            continue
        removed.append(entry)
    return removed


def _umask_mode(mode: int = 0o666) -> int:
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside target; rename it onto target only if the block succeeds."""
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        sweep_temporaries(target.parent, target.name)
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(target.name), suffix=".tmp", dir=target.parent)
    except OSError as exc:  # read-only place, a file where a folder should be, no space...
        raise UsageError(f"cannot write {target}: {one_line(exc)}") from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # mkstemp makes the file private (0600), and writers that replace the file (safetensors)
        # keep theirs private too: give it the mode a plain open() would, once it is written.
        tmp_path.chmod(_umask_mode())
        os.replace(tmp_path, target)
    finally:
        tmp_path.unlink(missing_ok=True)


def temporary_folder(target: str | Path) -> Path:
    """A new folder beside target under this tool's temporary name, with the mode the umask
    gives (mkdtemp's is private), after sweeping what killed runs left for target."""
    target = Path(target)
    sweep_temporaries(target.parent, target.name)
    folder = Path(tempfile.mkdtemp(prefix=_temp_prefix(target.name), suffix=".tmp", dir=target.parent))
    folder.chmod(_umask_mode(0o777))
    return folder


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def check_names(target: str | Path) -> None:
    """A one-line UsageError if a component of target is longer than the file system allows
    (or the whole path longer than the system's limit): caught before any work, not at the end."""
    target = Path(target)
    if "\0" in str(target):
        raise UsageError("cannot write the output: its path holds a NUL character")
    existing = target.absolute().parent
    while not _exists(existing) and existing != existing.parent:
        existing = existing.parent
    limit = _name_max(existing)
    for part in target.parts:
        if len(os.fsencode(part)) > limit:
            raise UsageError(f"cannot write {_short(target)}: the name {_short(part)} is longer than {limit} bytes")
    if len(os.fsencode(str(target.absolute()))) >= 4096:
        raise UsageError(f"cannot write {_short(target)}: the path is longer than 4095 bytes")


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long, a loop of links
        return False


def _short(text: str | Path, limit: int = 60) -> str:
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def check_not_input(output: str | Path, inputs: Iterable[str | Path], *, flag: str = "-o") -> None:
    """A one-line UsageError if output is an input, holds one or lies inside one: the input is
    read while the output is written, and writing over it loses it."""
    out = Path(os.path.realpath(output))
    for given in inputs:
        if given is None:
            continue
        source = Path(os.path.realpath(given))
        if out == source:
            raise UsageError(f"{flag} {output} is the input {given}; write the output elsewhere")
        if source in out.parents:
            raise UsageError(f"{flag} {output} lies inside the input {given}; write the output elsewhere")
        if out in source.parents:
            raise UsageError(f"{flag} {output} holds the input {given}; write the output elsewhere")


def check_output(
    output: str | Path, inputs: Iterable[str | Path] = (), *, directory: bool = False, flag: str = "-o"
) -> Path:
    """Every check an output gets before the work: writable, names within limits, not an input."""
    check_writable(output, directory=directory)
    check_not_input(output, inputs, flag=flag)
    return Path(output)


def is_empty_dir(path: Path) -> bool:
    try:
        return path.is_dir() and not any(path.iterdir())
    except OSError:
        return False


def json_format_is(fmt: str, file: str = "config.json") -> Callable[[Path], bool]:
    """A test of a directory: its `file` is JSON whose "format" is fmt (this tool's marker)."""

    def test(folder: Path) -> bool:
        try:
            header = json.loads((folder / file).read_text())
        except (OSError, ValueError, UnicodeDecodeError):
            return False
        return isinstance(header, dict) and header.get("format") == fmt

    return test


def check_replaceable(folder: str | Path, ours: Callable[[Path], bool], what: str, *, force: bool = False) -> bool:
    """Whether folder holds something to replace: False if absent or empty, True if it is this
    tool's own `what` (or force); a one-line UsageError for anything else, which is never
    replaced silently."""
    folder = Path(folder)
    if not folder.exists() or is_empty_dir(folder):
        return False
    if not folder.is_dir():
        raise UsageError(f"cannot write {what} {folder}: a file is in the way")
    if force or ours(folder):
        return True
    raise UsageError(
        f"refusing to replace {folder}: it is not empty and not a deamoe-trt {what}; "
        "choose another directory, empty it, or pass --force"
    )


@contextlib.contextmanager
def replaced_directory(
    folder: str | Path, ours: Callable[[Path], bool], what: str, *, force: bool = False, note=None
) -> Iterator[Path]:
    """Yield a temporary folder beside folder to write the whole output into; when the block
    succeeds it takes folder's place, so no file of an older output stays behind. folder may
    be replaced only if check_replaceable allows it; note(text) hears of a replacement."""
    folder = Path(folder)
    replace = check_replaceable(folder, ours, what, force=force)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = temporary_folder(folder)
    except OSError as exc:
        raise UsageError(f"cannot write {folder}: {one_line(exc)}") from None
    old = None
    try:
        yield staging
        if folder.exists():
            old = Path(tempfile.mkdtemp(prefix=_temp_prefix(folder.name), suffix=".tmp", dir=folder.parent))
            os.replace(folder, old / "old")
        os.replace(staging, folder)
        if replace and note is not None:
            note(f"replaced what was in {folder}")
    except OSError as exc:
        raise UsageError(f"cannot write {folder}: {one_line(exc)}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def check_writable(target: str | Path, *, directory: bool = False) -> Path:
    """target, if a file (or, with directory, files inside it) can be written there: the
    folder exists and is writable, or can be made inside a writable one. A one-line
    UsageError naming the obstacle otherwise. For commands to call before their work."""
    target = Path(target)
    check_names(target)
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
    # os.access says yes to root everywhere and knows nothing of /proc or a read-only mount:
    # make (and remove) a temporary there, so the place fails now rather than after the work.
    try:
        fd, probe = tempfile.mkstemp(prefix=_temp_prefix(target.name[:64]), suffix=".tmp", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"cannot write {_short(target)}: {folder} takes no new files ({exc.strerror})") from None
    return target


def read_json(path: Path, error: type[UsageError] = UsageError):
    """The JSON document at path; `error` with one line saying why when it is not valid JSON."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise error(f"{path} is nested too deeply to be a config") from None


def atomic_write_text(target: str | Path, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text)
