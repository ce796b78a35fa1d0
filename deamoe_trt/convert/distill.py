"""End-to-end healing of a converted language model: KL distillation from the source's logits,
with checkpoints, resume and data parallelism.

Each step draws a global batch of windows from a seeded generator (the same on every
process); process r of R takes windows r, r + R, ... of it. Its loss is the KL summed over
its tokens divided by the global batch's token count, so summing the gradients over the
processes (one all-reduce of one flat buffer) gives exactly the one-process gradient, and
every process then takes the same Adam step: R processes give one process's result within
float rounding (the order of the sums differs). Launch with `accelerate launch` or torchrun;
accelerate's process group (plain torch.distributed without accelerate) is gloo on CPUs and
NCCL on GPUs (init_distributed). With fsdp the healed blocks are sharded over the
processes instead (sharding.py), their gradients summed by FSDP's reduce-scatter.

Checkpoints (every N steps, written by process 0 to a temporary name, then renamed) hold the
trained parameters, Adam's state, the batch generator's state and the losses so far, in
safetensors (sharded values gathered whole); a run given the same checkpoint path resumes
from it and ends bit for bit where an uninterrupted run ends. A checkpoint of a different
run (settings or shapes) is refused.
"""

from __future__ import annotations

import json
import math
import os
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.nn import functional as F

from .._io import atomic_path
from ..console import Progress
from ..errors import UsageError
from .sharding import full, like, sharded


@dataclass(frozen=True)
class DistillSettings:
    steps: int
    lr: float = 1e-3
    batch_size: int = 8  # windows per step, over all processes together
    seed: int = 0
    checkpoint: str | None = None  # a .safetensors file to write and resume from
    checkpoint_every: int = 0  # steps between checkpoints (0: only with checkpoint, at the end)
    device: str = "cpu"
    fsdp: bool = False  # shard the healed blocks over the processes (sharding.py)

    def fingerprint(self) -> dict:
        """What must match for a checkpoint to be resumed (not where it is or how often)."""
        return {k: v for k, v in asdict(self).items() if k in ("steps", "lr", "batch_size", "seed")}


def world() -> tuple[int, int]:
    """(rank, world size) of this process; (0, 1) without torch.distributed."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_distributed(device: str) -> tuple[int, int]:
    """Join the job this process was launched in by `accelerate launch` or torchrun
    (WORLD_SIZE > 1) through accelerate's PartialState (torch.distributed where accelerate is
    not installed): NCCL for a CUDA device (each process on cuda:LOCAL_RANK), gloo otherwise;
    (rank, world size)."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        cuda = device.startswith("cuda")
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        try:
            from accelerate import PartialState
        except ImportError:
            dist.init_process_group(backend="nccl" if cuda else "gloo")
        else:
            PartialState(cpu=not cuda)
    return world()


def local_device(device: str) -> torch.device:
    if device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device)


def cosine_lr(optimizer, base: float, step: int, steps: int) -> None:
    for group in optimizer.param_groups:
        group["lr"] = base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / max(1, steps))))


def sum_across_ranks(params: list[torch.nn.Parameter], loss: torch.Tensor) -> None:
    """Sum every gradient and the loss over the processes, as one flat buffer."""
    import torch.distributed as dist

    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1)])
    dist.all_reduce(flat)
    offset = 0
    for p, g in zip(params, grads, strict=True):
        p.grad = flat[offset : offset + g.numel()].view_as(g).clone()
        offset += g.numel()
    loss.data.copy_(flat[-1])


def distill_lm(
    model,
    source,
    windows: torch.Tensor,
    settings: DistillSettings,
    *,
    blocks: list[int] | None = None,
    progress: Progress | None = None,
) -> list[float]:
    """Distil source's next-token distributions into model (in place) on token windows [W, L];
    the FFNs of `blocks` (default model's DeaMoE blocks) train, everything else stays. The
    global loss per step."""
    if settings.steps <= 0:
        return []
    _, size = world()
    if settings.batch_size < size:
        raise UsageError(f"the healing batch ({settings.batch_size} windows) must be at least the {size} processes")
    device = local_device(settings.device)
    blocks = model.moe_layers() if blocks is None else blocks
    model.to(device)
    source.to(device)
    healed = [p for i in blocks for p in model.layers[i].mlp.parameters()]
    frozen = [p for p in model.parameters() if all(p is not q for q in healed)]
    for p in frozen:
        p.requires_grad_(False)
    fsdp = settings.fsdp and size > 1
    try:
        with sharded(model, [f"layers.{i}" for i in blocks]) if fsdp else nullcontext():
            params = [p for i in blocks for p in model.layers[i].mlp.parameters()]
            return _distill(model, source, windows, settings, params, fsdp, progress)
    finally:
        for p in frozen:
            p.requires_grad_(True)
        model.eval()
        model.to("cpu")
        source.to("cpu")


def _distill(model, source, windows: torch.Tensor, settings: DistillSettings, params, fsdp: bool, progress):
    rank, size = world()
    device = local_device(settings.device)
    optimizer = torch.optim.Adam(params, lr=settings.lr)
    gen = torch.Generator().manual_seed(settings.seed)
    losses: list[float] = []
    start = _resume(settings, params, optimizer, gen, losses) if settings.checkpoint else 0
    if progress is not None and start:
        progress.update(f"resumed at step {start}", step=start)
    tokens_per_step = min(settings.batch_size, windows.shape[0]) * windows.shape[1]
    began = time.perf_counter()
    model.train()
    for step in range(start, settings.steps):
        cosine_lr(optimizer, settings.lr, step, settings.steps)
        batch = torch.randperm(windows.shape[0], generator=gen)[: settings.batch_size]
        ids = windows[batch[rank::size]].to(device)
        rows = len(batch) * windows.shape[1]  # the global batch's tokens
        with torch.no_grad():
            teacher = F.log_softmax(source(ids).logits, dim=-1)
        student = F.log_softmax(model(ids).logits, dim=-1)
        loss = F.kl_div(student.flatten(0, 1), teacher.flatten(0, 1), log_target=True, reduction="sum") / rows
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if size > 1:
            sum_across_ranks([] if fsdp else params, loss)  # FSDP summed the gradients itself
        optimizer.step()
        losses.append(loss.item())
        done = step + 1
        if settings.checkpoint and (rank == 0 or fsdp) and _due(settings, done):
            save_checkpoint(settings, params, optimizer, gen, losses, done, write=rank == 0)
        if progress is not None:
            elapsed = time.perf_counter() - began
            rate = (done - start) * tokens_per_step / max(elapsed, 1e-9)
            eta = (settings.steps - done) * elapsed / (done - start)
            progress.update(f"logit KL {losses[-1]:.4f}  {rate:,.0f} tok/s  ETA {eta:.0f}s")
    return losses


def _due(settings: DistillSettings, done: int) -> bool:
    every = settings.checkpoint_every
    return done == settings.steps or (every > 0 and done % every == 0)


def save_checkpoint(
    settings: DistillSettings, params, optimizer, gen: torch.Generator, losses, step: int, *, write: bool = True
) -> Path:
    """Write the checkpoint (if write). Sharded parameters are gathered whole first, a
    collective: then every process calls this, and one writes."""
    meta = {"step": step, "losses": losses, "settings": settings.fingerprint()}
    return save_training_state(Path(str(settings.checkpoint)), "healing", meta, params, optimizer, gen, write=write)


def _resume(settings: DistillSettings, params, optimizer, gen: torch.Generator, losses: list[float]) -> int:
    """Load settings.checkpoint into params, optimizer, gen and losses if it exists; its step."""
    path, expected = Path(str(settings.checkpoint)), {"settings": settings.fingerprint()}
    meta = load_training_state(path, "healing", expected, params, optimizer, gen)
    if meta is None:
        return 0
    losses[:] = meta["losses"]
    return int(meta["step"])


def save_training_state(
    path: Path, kind: str, meta: dict, params, optimizer, gen: torch.Generator, *, write: bool = True
) -> Path:
    """A training run's state in one safetensors file written whole (if write): params, their
    Adam(W) state and gen's state as tensors, meta (JSON: the step, the losses, what must
    match to resume) under the metadata key kind. Sharded values are gathered whole first, a
    collective: then every process calls this, and one writes."""
    from safetensors.torch import save_file

    tensors = {"generator": gen.get_state()}
    for i, p in enumerate(params):
        tensors[f"param.{i}"] = full(p.detach()).cpu().contiguous()
        state = optimizer.state.get(p, {})
        if state:
            tensors[f"step.{i}"] = torch.as_tensor(state["step"]).detach().cpu().reshape(1)
            tensors[f"exp_avg.{i}"] = full(state["exp_avg"].detach()).cpu().contiguous()
            tensors[f"exp_avg_sq.{i}"] = full(state["exp_avg_sq"].detach()).cpu().contiguous()
    if not write:
        return path
    meta = {**meta, "shapes": [list(p.shape) for p in params]}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={kind: json.dumps(meta)})
    return path


def load_training_state(path: Path, kind: str, expected: dict, params, optimizer, gen: torch.Generator) -> dict | None:
    """Load the state save_training_state wrote to path into params, optimizer and gen; its
    meta, or None when there is no file. A one-line UsageError when it is unreadable or its
    meta differs from expected (or its shapes from params')."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    what = f"{kind} checkpoint"
    if not path.exists():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get(kind, "null"))
        tensors = load_file(str(path))
    except (SafetensorError, OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"{what} {path} is unreadable: {exc}") from None
    if not isinstance(meta, dict) or "step" not in meta:
        raise UsageError(f"{path} is not a {what}")
    if any(meta.get(k) != v for k, v in expected.items()) or meta["shapes"] != [list(p.shape) for p in params]:
        theirs = ", ".join(str(meta.get(k)) for k in expected)
        raise UsageError(
            f"{what} {path} is of another run ({theirs}, {len(meta['shapes'])} tensors); remove it or give another path"
        )
    with torch.no_grad():
        for i, p in enumerate(params):
            p.copy_(like(p, tensors[f"param.{i}"]))
            if f"exp_avg.{i}" in tensors:
                optimizer.state[p] = {
                    "step": tensors[f"step.{i}"].reshape(()).clone(),
                    "exp_avg": like(p, tensors[f"exp_avg.{i}"]),
                    "exp_avg_sq": like(p, tensors[f"exp_avg_sq.{i}"]),
                }
    gen.set_state(tensors["generator"])
    return meta
