"""Argument groups shared by subcommands, so one flag means one thing everywhere."""

from __future__ import annotations

import argparse

import torch

DTYPE_NAMES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def token_counts(text: str) -> list[int]:
    """'1,4,16' -> [1, 4, 16]; argparse reports a ValueError/ArgumentTypeError as one line."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token counts like 1,4,16, got {text!r}") from None
    if not counts or any(c < 1 for c in counts):
        raise argparse.ArgumentTypeError(f"token counts must be integers >= 1, got {text!r}")
    return counts


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)


def unit_fraction(text: str) -> float:
    """A number in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


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
    parser.add_argument("--seed", type=int, default=0, help="seed for weights and random inputs (default 0)")


def add_dtype(parser: argparse.ArgumentParser, *, choices=tuple(DTYPE_NAMES), default: str = "fp32") -> None:
    parser.add_argument(
        "--dtype", choices=choices, default=default, help=f"weight and activation dtype (default {default})"
    )


def add_output(parser: argparse.ArgumentParser, *, required: bool = True, help: str = "output path") -> None:
    parser.add_argument("-o", "--output", required=required, metavar="PATH", help=help)
