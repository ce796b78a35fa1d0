"""Argument groups shared by subcommands, so one flag means one thing everywhere."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence

from ..dtypes import DTYPES

DTYPE_NAMES = {d.name: d.torch for d in DTYPES}


# Argument types: argparse reports their ArgumentTypeError as one line, exit 2.


def int_list(low: int, noun: str, example: str) -> Callable[[str], list[int]]:
    """'1,4,16' -> [1, 4, 16]: at least one integer, each >= low; noun names them in errors."""

    def parse(text: str) -> list[int]:
        try:
            values = [int(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {noun} like {example}, got {text!r}") from None
        if not values or any(v < low for v in values):
            raise argparse.ArgumentTypeError(f"{noun} must be integers >= {low}, got {text!r}")
        return values

    return parse


def int_at_least(low: int, what: str | None = None) -> Callable[[str], int]:
    """An integer >= low; what (default "an integer >= low") says what was expected."""
    expected = what or f"an integer >= {low}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


def number(what: str, accept: Callable[[float], bool]) -> Callable[[str], float]:
    """A float that accept() takes (NaN never is); what says which ones, e.g. "a number in [0, 1)"."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value != value or not accept(value):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


def int_in_range(low: int, high: int, what: str) -> Callable[[str], int]:
    """An integer in [low, high]; what names it in the one-line error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, an integer in [{low}, {high}], got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {what}, an integer in [{low}, {high}], got {text!r}")
        return value

    return parse


def _thread_limit() -> int:
    # Past a few per core threads only contend, and thousands exhaust the stack space the
    # OpenMP runtime asks for (a crash, not an error).
    return max(64, 4 * (os.cpu_count() or 1))


# Tokens per decoding step: far past any batch a step runs, and a bound on what one allocates.
MAX_STEP_TOKENS = 65536


def token_list(text: str) -> list[int]:
    values = int_list(1, "token counts", "1,4,16")(text)
    if any(v > MAX_STEP_TOKENS for v in values):
        raise argparse.ArgumentTypeError(f"token counts must be at most {MAX_STEP_TOKENS}, got {text!r}")
    return values


token_counts = token_list
thread_count = int_in_range(1, _thread_limit(), "a thread count")
seed_value = int_in_range(0, 2**63 - 1, "a seed")
positive_int = int_at_least(1)
non_negative_int = int_at_least(0)
unit_fraction = number("a number in [0, 1)", lambda v: 0 <= v < 1)
# A memory size in GB: positive and finite, at most an exabyte.
gigabytes = number("a number of GB > 0", lambda v: 0 < v <= 2**30)


def add_checkpoint(parser: argparse.ArgumentParser, *, name: str = "checkpoint", help: str | None = None) -> None:
    parser.add_argument(name, metavar="CKPT", help=help or "checkpoint directory (config.json + model.safetensors)")


def add_tokens(parser: argparse.ArgumentParser, default: str = "1,2,4,8") -> None:
    parser.add_argument(
        "--tokens",
        type=token_counts,
        default=token_counts(default),
        metavar="N,N,...",
        help=f"tokens per decoding step to try (default {default})",
    )


def add_seed(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=seed_value, default=0, help="seed for weights and random inputs (default 0)")


def add_dtype(parser: argparse.ArgumentParser, *, choices=tuple(DTYPE_NAMES), default: str = "fp32") -> None:
    parser.add_argument(
        "--dtype", choices=choices, default=default, help=f"weight and activation dtype (default {default})"
    )


def writable_path(text: str, *, directory: bool = False) -> str:
    """An output path argparse checks before the command runs (one line, exit 2, if unwritable)."""
    from .._io import check_writable
    from ..errors import UsageError

    try:
        check_writable(text, directory=directory)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def writable_directory(text: str) -> str:
    return writable_path(text, directory=True)


def add_output(
    parser: argparse.ArgumentParser, *, required: bool = True, help: str = "output path", directory: bool = False
) -> None:
    """-o/--output, checked writable at parse time (directory: a folder the command fills)."""
    kind = writable_directory if directory else writable_path
    parser.add_argument("-o", "--output", required=required, metavar="PATH", type=kind, help=help)


def add_twin(parser: argparse.ArgumentParser) -> None:
    """--twin of the export commands: which one model of a checkpoint's twins is written."""
    parser.add_argument(
        "--twin",
        choices=("deamoe", "expanded", "vanilla"),
        default="deamoe",
        help="export the model (default), its expanded twin (same outputs, no sharing) or its vanilla twin",
    )


def add_force(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace a non-empty output directory that is not this command's own output",
    )


def note(text: str) -> None:
    """One line on stderr that is not an error: what a command did beside its output."""
    import sys

    print(f"note: {text}", file=sys.stderr)


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line naming the command and where help is."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace | int:
    """parser's arguments, or the exit status argparse stopped with: 2 after a Parser's
    one-line error, 0 after --help. For commands whose main(argv) returns its status."""
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2


def parse_error(parser: argparse.ArgumentParser, message: str) -> int:
    """parser's one-line error for a check made after parsing; the exit status to return (2)."""
    try:
        parser.error(message)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    return 2


def name_list(choices: Sequence[str], what: str, *, plural: str = "") -> Callable[[str], list[str]]:
    """A type for a comma-separated list drawn from choices: the names in order, each once;
    an unknown one is one line naming it and the choices."""
    plural = plural or f"{what}(s)"

    def parse_names(text: str) -> list[str]:
        names = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
        if unknown := [n for n in names if n not in choices]:
            raise argparse.ArgumentTypeError(f"unknown {plural} {', '.join(unknown)}; choose from {', '.join(choices)}")
        if not names:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}s, got {text!r}")
        return names

    return parse_names
