"""A command's work folder (OUTPUT.work, beside its output): finished pieces of a long
computation kept so that a killed run, rerun with the same arguments, picks up where it was.

Each piece is one safetensors file written whole (temporary name, then rename): its tensors,
a JSON description of what they rebuild, and torch's global random state after the piece was
computed, restored when the piece is loaded so that what follows draws the same numbers an
uninterrupted run draws. state.json holds a fingerprint of the source weights, the data and
the settings: a folder of another run is set aside with a one-line note and the run starts
over. convert (deamoe_trt.convert.resume's modules), quantize's AWQ and train (each model
trained whole, beside the checkpoints of the one in training) keep their pieces here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from ._io import atomic_path, atomic_write_text, read_json
from .errors import UsageError

STATE_FILE = "state.json"
# A pieces file's metadata keys.
_META, _RNG = "piece", "__rng__"


class WorkCache:
    """The pieces of one run in `folder`; `writer` False for processes that only read."""

    def __init__(self, folder: Path, writer: bool = True):
        self.folder, self.writer = folder, writer
        self.loaded: list[str] = []  # the pieces taken from the folder, in order

    def path(self, key: str) -> Path:
        return self.folder / (_safe(key) + ".safetensors")

    def piece(
        self,
        key: str,
        compute: Callable[[], Any],
        pack: Callable[[Any], tuple[dict[str, torch.Tensor], Any]],
        unpack: Callable[[dict[str, torch.Tensor], Any], Any],
    ) -> Any:
        """The piece `key`: loaded when a finished one is here, else computed and kept."""
        path = self.path(key)
        if path.is_file():
            try:
                with safe_open(str(path), framework="pt") as f:
                    meta = json.loads((f.metadata() or {})[_META])
                tensors = load_file(str(path))
            except (SafetensorError, OSError, KeyError, json.JSONDecodeError):
                pass  # not a whole piece: compute it again
            else:
                value = unpack(tensors, meta)
                torch.set_rng_state(tensors[_RNG])
                self.loaded.append(key)
                return value
        value = compute()
        if self.writer:
            tensors, meta = pack(value)
            tensors = {n: t.detach().cpu().clone().contiguous() for n, t in tensors.items()}  # no shared storage
            tensors[_RNG] = torch.get_rng_state()
            with atomic_path(path) as tmp:
                save_file(tensors, str(tmp), metadata={_META: json.dumps(meta)})
        return value


def open_work(
    folder: str | Path,
    fingerprint: str,
    *,
    writer: bool = True,
    log=None,
    command: str = "convert",
    what: str = "conversion",
) -> WorkCache:
    """The work folder of this `what` (a run of `command`): its pieces if state.json matches
    fingerprint, a fresh one otherwise (a folder of another run removed, with a note)."""
    folder, log = Path(folder), log or sys.stderr
    state_path = folder / STATE_FILE
    if state_path.is_file():
        state = read_json(state_path)
        if isinstance(state, dict) and state.get("fingerprint") == fingerprint:
            print(f"{command}: resuming from the finished work in {folder}", file=log)
            return WorkCache(folder, writer)
        if writer:
            print(f"{command}: note: {folder} holds another {what}'s work (other arguments); starting over", file=log)
            shutil.rmtree(folder)
    elif folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UsageError(f"{folder} exists and is not a {what}'s work folder; move it away")
    if writer:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(state_path, json.dumps({"fingerprint": fingerprint}, indent=1) + "\n")
    return WorkCache(folder, writer)


def fingerprint(tensors: list[torch.Tensor], settings: Any, **more: Any) -> str:
    """A digest of the tensors' bytes (the source weights, the data), the settings and more."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    what = {"settings": dataclasses.asdict(settings), **more}
    what["settings"].pop("heal_checkpoint_every", None)  # where and how often it saves, not what it computes
    what["settings"].pop("heal_checkpoint", None)
    h.update(json.dumps(what, sort_keys=True, default=str).encode())
    return h.hexdigest()


def work_dir(output: str | Path) -> Path:
    """The work folder of the run writing output: OUTPUT.work beside it."""
    output = Path(output)
    return output.with_name(output.name + ".work")


def _safe(key: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "-" for c in key)
