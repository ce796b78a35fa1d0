"""Calibration and held-out inputs for a conversion, from a checkpoint and --calibration.

Language models: a text (default the shipped one), encoded with the model's tokenizer and
split by position like training does: the first 90% calibrates, the last 10% is held out.
Windows of seq_len + 1 tokens are taken evenly from each part. Each block's calibration
hidden states are the source model's own FFN inputs on those windows.
Token ids instead of a text: a safetensors file with "input_ids".
Layer and stack checkpoints: random unit-variance hidden states (deamoe_trt.inputs), or a
safetensors file with "hidden_states" [T, d]; 10% of its rows (at least the last 64) are
held out. A stack's layer i sees the source stack's residual stream after layers < i.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..checkpoint import read_tensors
from ..errors import UsageError
from ..inputs import random_hidden, stack_hidden
from .run import Source, source_lm_hidden

CALIBRATION_WINDOWS = 64
HELDOUT_WINDOWS = 16
RANDOM_TOKENS = 4096
HELDOUT_FRACTION = 0.1


def windows_of(ids: torch.Tensor, length: int, count: int) -> torch.Tensor:
    """count windows of `length` tokens spread evenly over ids (fewer if ids is short)."""
    available = len(ids) // length
    if available < 1:
        raise UsageError(f"the calibration text is too short: {len(ids)} tokens, need at least {length}")
    starts = torch.linspace(0, len(ids) - length, min(count, available)).long()
    return torch.stack([ids[s : s + length] for s in starts.tolist()])


def lm_source(
    lm,
    tokenizer,
    text: str | torch.Tensor,
    *,
    seq_len: int = 128,
    heldout_fraction: float = HELDOUT_FRACTION,
    heal_on_all: bool = False,
    heldout_windows: int = HELDOUT_WINDOWS,
) -> Source:
    """text: a string (encoded with tokenizer) or token ids (any shape, read in order).
    heal_on_all: healing reads every window of the calibration part (data read with
    --data), not only the CALIBRATION_WINDOWS the fit sees."""
    ids, cut, calibration, heldout = lm_windows(
        lm.config, tokenizer, text, seq_len, heldout_fraction, heldout_windows=heldout_windows
    )
    length = calibration.shape[1]
    return Source(
        layers=[lm.layers[i].mlp for i in lm.moe_layers()],  # dense blocks stay as they are
        calibration=source_lm_hidden(lm, calibration[:, :-1]),
        heldout=source_lm_hidden(lm, heldout[:, :-1]),
        lm=lm,
        calibration_windows=calibration,
        heldout_windows=heldout,
        heal_windows=_all_windows(ids[:cut], length) if heal_on_all else None,
    )


def lm_windows(
    config,
    tokenizer,
    text: str | torch.Tensor,
    seq_len: int = 128,
    heldout_fraction: float = HELDOUT_FRACTION,
    *,
    heldout_windows: int = HELDOUT_WINDOWS,
) -> tuple[torch.Tensor, int, torch.Tensor, torch.Tensor]:
    """(token ids, where the held-out part starts, calibration windows, held-out windows) of
    text for a model of config (an LMConfig); windows are [W, seq_len + 1] token ids."""
    if isinstance(text, torch.Tensor):
        ids = text.reshape(-1).long()
        vocab = config.vocab_size
        if ids.numel() and not (int(ids.min()) >= 0 and int(ids.max()) < vocab):
            raise UsageError(f"calibration token ids must be in [0, {vocab}), got {int(ids.min())}..{int(ids.max())}")
    else:
        ids = torch.tensor(tokenizer.encode(text, what="the calibration text"), dtype=torch.long)
    length = min(seq_len, config.max_position_embeddings - 1) + 1
    cut = int(len(ids) * (1 - heldout_fraction))
    if cut < 2 * length or len(ids) - cut < length:
        raise UsageError(
            f"the calibration text is too short: {len(ids)} tokens; need at least {10 * length} "
            f"(90% to calibrate, 10% held out, windows of {length})"
        )
    return ids, cut, windows_of(ids[:cut], length, CALIBRATION_WINDOWS), windows_of(ids[cut:], length, heldout_windows)


def _all_windows(ids: torch.Tensor, length: int) -> torch.Tensor:
    """Every non-overlapping window of `length` tokens of ids, in order."""
    count = len(ids) // length
    return ids[: count * length].reshape(count, length)


def stack_source(stack, hidden: torch.Tensor | None = None, *, seed: int = 0, tokens: int = RANDOM_TOKENS) -> Source:
    d = stack.config.hidden_size
    if hidden is None:
        hidden = random_hidden(tokens + max(64, tokens // 4), d, seed=seed)
    if hidden.dim() != 2 or hidden.shape[1] != d:
        raise UsageError(f"calibration hidden_states must have shape [tokens, {d}], got {list(hidden.shape)}")
    held = max(64, int(hidden.shape[0] * HELDOUT_FRACTION))
    if hidden.shape[0] <= held:
        raise UsageError(f"the calibration is too short: {hidden.shape[0]} hidden states")
    hidden = hidden.float()
    return Source(
        layers=list(stack.layers),
        calibration=stack_hidden(stack, hidden[:-held].to(stack.dtype)),
        heldout=stack_hidden(stack, hidden[-held:].to(stack.dtype)),
    )


def read_calibration_tensor(path: str | Path, name: str) -> torch.Tensor:
    """Tensor `name` of a safetensors file: hidden_states [T, d] for layers, input_ids for LMs."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"calibration file {path} does not exist")
    tensors = read_tensors(path)
    if name not in tensors:
        raise UsageError(f"{path} has no tensor named {name} (found: {', '.join(sorted(tensors)) or 'none'})")
    return tensors[name]


def read_text(path: str | Path) -> str:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"calibration text {path} does not exist")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"calibration text {path} is not UTF-8: {exc.reason} at byte {exc.start}") from None
