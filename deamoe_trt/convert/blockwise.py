"""A language model converted one block at a time, in bounded memory, resumable.

What `deamoe-trt convert` runs for a language model without baselines, healing or a plot
(--no-compare): the same conversion as deamoe_trt.convert.run (each DeaMoE block's FFN
converted with the "aligned" method on the source model's own FFN inputs), without ever
holding more than one block.

Work folder (OUTPUT.work, beside the output):
- hidden-K.safetensors: the source model's residual stream entering block K on the
  calibration and held-out windows (the previous source block's outputs), [W, L, d];
- block-K.safetensors: block K's converted FFN;
- state.json: a fingerprint of the source, the settings and the calibration data, and per
  finished block its time, held-out error and department-score agreements.
Each file is written whole (temporary name, then rename) and state.json last: after a kill,
the same command resumes at the first block state.json does not list and writes the same
bytes an uninterrupted run writes. A work folder of another source or other settings is
refused. Memory: one source block, its conversion and the hidden states.

The department score is one for the whole model: the one whose summed agreement over the
blocks is highest (as run.py chooses it); a block's weights do not depend on it, so it is
chosen once every block is done.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from .._io import atomic_path, atomic_write_text, read_json
from ..checkpoint import CONFIG_FILE, ROUTER_BIAS, WEIGHTS_FILE, dtype_name
from ..errors import UsageError
from ..lm.checkpoint import FORMAT, FORMAT_VERSION, expected_tensors, read_lm_header
from ..lm.checkpoint_format import checked_index
from ..lm.model import Block, DeaMoELM, rope_tables
from ..lm.tokenizer import HFTokenizer
from ..safetensors_io import ShardReader, StreamingWriter
from ..work_folder import STATE_FILE, work_dir
from .core import ConvertSettings, convert_layer, plan_order
from .metrics import relative_error
from .sources import HELDOUT_FRACTION, lm_windows


def convert_lm_blockwise(
    source: str | Path,
    output: str | Path,
    settings: ConvertSettings,
    text: str | torch.Tensor,
    *,
    seq_len: int = 128,
    heldout_fraction: float = HELDOUT_FRACTION,
    log=None,
) -> dict[str, Any]:
    """Convert the checkpoint at source into output; returns the conversion summary stored in
    its config.json (per block: held-out relative error of the FFN, expert order)."""
    source, output, log = Path(source), Path(output), log or sys.stderr
    header = read_lm_header(source)
    config, dtype, tokenizer = header["config"], _dtype(header["dtype"]), header["tokenizer"]
    if config.quantization is not None:
        raise UsageError(f"{source} is quantized; convert takes the float model (quantize after converting)")
    skeleton = DeaMoELM(config, dtype=dtype, device="meta")
    moe = skeleton.moe_layers()
    if not moe:
        raise UsageError(f"{source} has no MoE blocks to convert")
    settings.check(config.moe)
    index = checked_index(source, expected_tensors(skeleton), header["dtype"])
    _, _, calibration, heldout = lm_windows(config, tokenizer, text, seq_len, heldout_fraction)
    work = work_dir(output)
    fingerprint = _fingerprint(source, settings, calibration, heldout)
    state = _start(work, fingerprint, source)
    cos, sin = rope_tables(config)
    length = calibration.shape[1] - 1
    cos, sin = cos[:length], sin[:length]
    done = len(state["blocks"])
    if done == 0:
        reader = ShardReader(index)
        try:
            embed = reader.get("embed_tokens.weight").to(dtype)
        finally:
            reader.close()
        hidden = {
            name: _embed(embed, ids[:, :-1], config)
            for name, ids in (("calibration", calibration), ("heldout", heldout))
        }
        del embed
        _save(work / "hidden-0.safetensors", hidden)
    else:
        hidden = load_file(work / f"hidden-{done}.safetensors")
        print(f"convert: resuming at block {done + 1}/{config.num_layers} from {work}", file=log)
    spent = sum(b["seconds"] for b in state["blocks"])
    for k in range(done, config.num_layers):
        start = time.perf_counter()
        block = _source_block(index, config, dtype, k)
        after, ffn_in = _run_block(block, hidden, cos, sin)
        entry: dict[str, Any] = {"block": k}
        if block.is_moe:
            x, x_held = ffn_in
            order = plan_order(block.mlp, x, settings)
            converted = convert_layer(block.mlp, x, settings, method="aligned", order=order)
            with torch.no_grad():
                held = x_held.to(block.mlp.dtype)
                entry["relative_error"] = round(relative_error(converted.layer(held), block.mlp(held)), 6)
            entry["order"] = order.tolist()
            entry["agreement"] = converted.agreement_by_score
            state_dict = {f"layers.{k}.mlp.{n}": t.contiguous() for n, t in converted.layer.state_dict().items()}
            _save(work / f"block-{k}.safetensors", state_dict)
            entry["config"] = converted.layer.config.to_dict()
        _save(work / f"hidden-{k + 1}.safetensors", after)
        entry["seconds"] = round(time.perf_counter() - start, 3)
        state["blocks"].append(entry)
        atomic_write_text(work / STATE_FILE, json.dumps(state, indent=1) + "\n")  # the block is done
        (work / f"hidden-{k}.safetensors").unlink(missing_ok=True)
        hidden = after
        spent += entry["seconds"]
        left = config.num_layers - k - 1
        error = f", held-out FFN error {entry['relative_error']:.4f}" if "relative_error" in entry else ""
        eta = spent / (k + 1) * left
        print(
            f"convert: block {k + 1}/{config.num_layers} in {entry['seconds']:.1f} s{error}; ETA {eta:.0f} s", file=log
        )
    described = {
        "layers": len(moe),
        "num_experts": config.moe.num_experts,
        "expert_width": config.moe.expert_intermediate_size,
        "top_k": config.moe.top_k,
        "hidden_size": config.hidden_size,
        "calibration_tokens": calibration.shape[0] * length,
        "heldout_tokens": heldout.shape[0] * length,
        "kind": "language model",
    }
    summary = _assemble(source, output, index, config, dtype, tokenizer, state, settings, described)
    shutil.rmtree(work, ignore_errors=True)
    return summary


def _run_block(block: Block, hidden: dict[str, torch.Tensor], cos, sin):
    """The block's outputs on each set of hidden states, and its FFN inputs [N, d] on each."""
    ffn_in: list[torch.Tensor] = []
    hook = block.post_attention_layernorm.register_forward_hook(
        lambda _m, _i, out: ffn_in.append(out.detach().reshape(-1, out.shape[-1]))
    )
    try:
        with torch.no_grad():
            after = {name: block(x, cos, sin, None)[0] for name, x in hidden.items()}
    finally:
        hook.remove()
    return after, ffn_in


def _dtype(name: str) -> torch.dtype:
    from ..checkpoint import DTYPES

    return DTYPES[name]


def _embed(embed: torch.Tensor, ids: torch.Tensor, config) -> torch.Tensor:
    x = torch.nn.functional.embedding(ids, embed)
    return x * config.embedding_multiplier if config.embedding_multiplier != 1 else x


def _source_block(index: dict, config, dtype: torch.dtype, k: int) -> Block:
    """Block k of the source, read from disk alone."""
    block = Block(config, k, dtype=dtype, device="meta")
    prefix = f"layers.{k}."
    reader = ShardReader(index)
    try:
        tensors = {name[len(prefix) :]: reader.get(name) for name in index if name.startswith(prefix)}
    finally:
        reader.close()
    tensors = {n: t.float() if n.endswith(ROUTER_BIAS) else t for n, t in tensors.items()}
    block.load_state_dict(tensors, assign=True)
    return block.eval()


def _fingerprint(source: Path, settings: ConvertSettings, calibration: torch.Tensor, heldout: torch.Tensor) -> str:
    weights = (source / WEIGHTS_FILE).stat()
    what = {
        "source": str(source.resolve()),
        "config": (source / CONFIG_FILE).read_text(),
        "weights": [weights.st_size, weights.st_mtime_ns],
        "settings": dataclasses.asdict(settings),
        "calibration": hashlib.sha256(calibration.numpy().tobytes()).hexdigest(),
        "heldout": hashlib.sha256(heldout.numpy().tobytes()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def _start(work: Path, fingerprint: str, source: Path) -> dict[str, Any]:
    """The saved state if work holds this conversion's, a fresh one if work is new; a
    one-line refusal for another conversion's work."""
    path = work / STATE_FILE
    if path.is_file():
        state = read_json(path)
        if not isinstance(state, dict) or state.get("fingerprint") != fingerprint:
            raise UsageError(
                f"{work} holds an unfinished conversion of another source or with other settings; "
                f"rerun that command to finish it, or delete {work} to start over from {source}"
            )
        return state
    if work.exists() and any(work.iterdir()):
        raise UsageError(f"{work} exists and is not a conversion's work folder; move it away")
    work.mkdir(parents=True, exist_ok=True)
    state = {"fingerprint": fingerprint, "blocks": []}
    atomic_write_text(path, json.dumps(state, indent=1) + "\n")
    return state


def _save(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    with atomic_path(path) as tmp:
        save_file({n: t.contiguous() for n, t in tensors.items()}, str(tmp))


def _assemble(source, output, index, config, dtype, tokenizer, state, settings, described) -> dict[str, Any]:
    """The converted checkpoint: each tensor streamed from its block file or the source."""
    from ..config import DeaMoEConfig

    blocks = [b for b in state["blocks"] if "config" in b]
    if settings.department_score is not None:
        score = settings.department_score
    else:
        totals: dict[str, float] = {}
        for b in blocks:
            for s, value in b["agreement"].items():
                totals[s] = totals.get(s, 0.0) + value
        score = max(totals, key=lambda s: totals[s])
    moe = DeaMoEConfig.from_dict(blocks[0]["config"]).replace(department_score=score)
    converted = config.replace(moe=moe)
    skeleton = DeaMoELM(converted, dtype=dtype, device="meta")
    schema = {n: (tuple(t.shape), t.dtype) for n, t in expected_tensors(skeleton).items()}
    moe_prefixes = tuple(f"layers.{b['block']}.mlp." for b in blocks)
    work = work_dir(output)
    output.mkdir(parents=True, exist_ok=True)
    reader = ShardReader(index)
    try:
        with atomic_path(output / WEIGHTS_FILE) as tmp, tmp.open("wb") as f:
            writer = StreamingWriter(f, schema)
            current: tuple[int, dict[str, torch.Tensor]] = (-1, {})
            for name in schema:
                if name.startswith(moe_prefixes):
                    k = int(name.split(".")[1])
                    if current[0] != k:
                        current = (k, load_file(work / f"block-{k}.safetensors"))
                    writer.write(name, current[1][name])
                else:
                    writer.write(name, reader.get(name))
            writer.close()
    finally:
        reader.close()
    summary = {
        "converted_from": str(source),
        "source": described,
        "method": "converted (block by block)",
        "department_score": score,
        "expert_order": [b["order"] for b in blocks],
        "relative_error": [b["relative_error"] for b in blocks],
    }
    header = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "dtype": dtype_name(dtype),
        "config": converted.to_dict(),
        "tokenizer": tokenizer.to_dict(),
        "training": {"conversion": summary},
    }
    if isinstance(tokenizer, HFTokenizer):
        tokenizer.save(output)
    atomic_write_text(output / CONFIG_FILE, json.dumps(header, indent=2) + "\n")
    return summary
