"""Errors the CLI turns into one line on stderr and an exit code.

`UsageError` (exit 2) is for input the user can fix: a bad flag, config, checkpoint or
model file. `DeaMoEError` (exit 1) is for a run that failed: a tolerance exceeded, a
missing runtime such as TensorRT.
"""


class DeaMoEError(Exception):
    exit_code = 1


class UsageError(DeaMoEError):
    exit_code = 2


class CheckpointError(UsageError):
    """A checkpoint that is missing, truncated, corrupt or does not match its config."""


class MissingDependencyError(DeaMoEError):
    """An optional runtime (TensorRT, CUDA, a compiler) is not available here."""


def one_line(exc: BaseException, *, first: bool = False, limit: int | None = None) -> str:
    """exc's message on one line (whitespace runs joined), or its type's name if it has none.

    first: keep only the first line, for third-party messages whose later lines are noise
    (a traceback, a list of candidates); limit: cut to that many characters.
    """
    text = str(exc).strip()
    if first:
        text = text.splitlines()[0] if text else ""
    text = " ".join(text.split())
    return (text[:limit] if limit else text) or type(exc).__name__
