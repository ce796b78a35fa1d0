"""Train a small DeaMoE language model on the shipped text, deterministically, on a CPU.

The text (data/persuasion.txt, Jane Austen's "Persuasion", public domain; see data/SOURCE.md)
is split by position: the first 90% trains, the last 10% measures validation loss. Batches
are random windows drawn from a torch.Generator seeded with the seed; the model's weights
come from the same seed; torch runs with deterministic algorithms on a fixed number of
threads, so a seed and a thread count give the same losses and weights on every run.

Loss: next-byte cross-entropy (nats) plus a small Switch-Transformer load-balancing term
per block (num_experts * sum_e f_e * P_e, f_e the share of routing slots expert e got and
P_e its mean router score), which keeps the routers from collapsing onto a few experts.
Reported losses are the cross-entropy alone.

Data parallel under torchrun (the engine end-to-end healing uses, deamoe_trt.convert.distill):
every process draws the same global batch, process r of R trains on windows r, r + R, ...,
its cross-entropy is summed over its tokens and divided by the global batch's, the
load-balancing term uses the global expert shares (one all-reduce of the counts), and one
all-reduce of the gradients gives every process the one-process gradient and the same step.
R processes give one process's result within float rounding; one process computes exactly
as before. With fsdp the blocks and the rest of the model are sharded over the processes
instead (deamoe_trt.convert.sharding), their gradients summed by FSDP's reduce-scatter.

Resume: given a checkpoint path, the run writes its state there every checkpoint_every
steps (the weights, AdamW's state and the batch generator's state as safetensors, the step,
the losses and the settings as JSON; deamoe_trt.convert.distill.save_training_state, written
whole by process 0, sharded values gathered first) and, when the file is there at the start,
continues from it: the batches, steps and weights are those of an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import lzma
import math
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import torch
from torch.nn import functional as F

from ..console import Progress
from ..convert.distill import load_training_state, save_training_state, sum_across_ranks, world
from ..convert.sharding import sharded
from ..errors import UsageError
from ..lm.config import LMConfig
from ..lm.model import DeaMoELM
from ..lm.presets import get_lm_preset
from ..lm.tokenizer import ByteTokenizer
from ..routing import LOAD_BALANCE_COEF, Routing, load_balance_loss
from .determinism import deterministic_threads

TEXT_NAME = "persuasion.txt"
TEXT_SOURCE = "Jane Austen, Persuasion (1818), public domain; via Debian r-cran-janeaustenr 1.0.0-1"

# Shipped texts by name: the files (in deamoe_trt/lm/data, .xz ones compressed) joined in
# order, and where they come from. "austen" ends with Persuasion, longer than a tenth of the
# whole, so the held-out tail (the last 10%) is the end of that novel.
CORPORA: dict[str, tuple[tuple[str, ...], str]] = {
    "persuasion": ((TEXT_NAME,), TEXT_SOURCE),
    "austen": (
        ("austen-five.txt.xz", TEXT_NAME),
        "Jane Austen's six novels (1811-1818; Persuasion last), public domain; via Debian r-cran-janeaustenr 1.0.0-1",
    ),
    # Source code: 23 whole modules of CPython 3.11.2's standard library (data/SOURCE.md).
    "cpython": (
        ("cpython-stdlib.txt.xz",),
        "23 CPython 3.11.2 standard-library modules, PSF License Version 2 (data/cpython-LICENSE.txt); "
        "via Debian libpython3.11-minimal/-stdlib 3.11.2-6+deb12u6",
    ),
}


def shipped_text(corpus: str = "persuasion") -> str:
    if corpus not in CORPORA:
        raise UsageError(f"unknown text {corpus!r}; shipped: {', '.join(CORPORA)}")
    folder = resources.files("deamoe_trt.lm").joinpath("data")
    parts = []
    for name in CORPORA[corpus][0]:
        data = folder.joinpath(name).read_bytes()
        parts.append((lzma.decompress(data) if name.endswith(".xz") else data).decode("ascii"))
    return "".join(parts)


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 1500
    batch_size: int = 16
    seq_len: int = 128
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    aux_loss_coef: float = LOAD_BALANCE_COEF
    val_fraction: float = 0.1
    eval_batches: int = 8
    log_every: int = 50
    seed: int = 0
    threads: int = 1
    fsdp: bool = False  # with several processes, shard the model over them (convert/sharding.py)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "seq_len", "eval_batches", "log_every", "threads"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")


# Resumable runs checkpoint this many times over their steps (about; at least every step).
CHECKPOINTS_PER_RUN = 10


def checkpoint_every(steps: int) -> int:
    return max(1, steps // CHECKPOINTS_PER_RUN)


# `--quick`: seconds, for tests and a first look; the loss still drops visibly.
QUICK = TrainSettings(steps=40, batch_size=8, seq_len=64, lr=5e-3, warmup=5, eval_batches=2, log_every=10)


@dataclass
class TrainResult:
    model: DeaMoELM
    tokenizer: ByteTokenizer
    initial_val_loss: float
    train_loss: float  # mean cross-entropy of the last 10% of steps (at least 1)
    val_loss: float
    losses: list[float] = field(default_factory=list)  # cross-entropy per step
    seconds: float = 0.0
    text_source: str = TEXT_SOURCE

    def summary(self, settings: TrainSettings) -> dict:
        return {
            "text": self.text_source,
            "tokenizer": "bytes",
            "steps": settings.steps,
            "batch_size": settings.batch_size,
            "seq_len": settings.seq_len,
            "lr": settings.lr,
            "seed": settings.seed,
            "threads": settings.threads,
            "initial_val_loss": round(self.initial_val_loss, 4),
            "train_loss": round(self.train_loss, 4),
            "val_loss": round(self.val_loss, 4),
            "seconds": round(self.seconds, 1),
            "torch": torch.__version__,
        }


def split_text(text: str, tokenizer: ByteTokenizer, val_fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor(tokenizer.encode(text, what="the training text"), dtype=torch.long)
    cut = int(len(ids) * (1 - val_fraction))
    return ids[:cut], ids[cut:]


def windows(data: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    if len(data) <= seq_len + 1:
        raise UsageError(f"the text has {len(data)} tokens, too few for windows of {seq_len + 1}")
    starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=gen)
    chunk = torch.stack([data[s : s + seq_len + 1] for s in starts.tolist()])
    return chunk[:, :-1], chunk[:, 1:]


def global_load_balance_loss(routing: Routing, num_experts: int, tokens: int) -> torch.Tensor:
    """This process's part of the load-balancing term of a global batch of `tokens` tokens
    split over the processes: the expert shares are the global ones; the parts sum to
    load_balance_loss over the whole batch."""
    import torch.distributed as dist

    counts = torch.zeros(num_experts, device=routing.scores.device)
    counts.scatter_add_(0, routing.expert_ids.reshape(-1), torch.ones(routing.expert_ids.numel()))
    dist.all_reduce(counts)
    share = counts / counts.sum()
    return num_experts * (share * routing.scores.sum(0) / tokens).sum()


@torch.no_grad()
def evaluate(model: DeaMoELM, data: torch.Tensor, settings: TrainSettings) -> float:
    """Mean cross-entropy over fixed windows (the same ones at every call and for every seed)."""
    gen = torch.Generator().manual_seed(0x5EED)
    was_training = model.training
    model.eval()
    total = 0.0
    for _ in range(settings.eval_batches):
        x, y = windows(data, settings.batch_size, settings.seq_len, gen)
        logits = model(x).logits
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
    model.train(was_training)
    return total / settings.eval_batches


def train(
    config: LMConfig | None = None,
    settings: TrainSettings | None = None,
    *,
    text: str | None = None,
    tokenizer: ByteTokenizer | None = None,
    progress: bool = True,
    model: DeaMoELM | None = None,
    label: str = "train-tiny",
    corpus: str = "persuasion",
    checkpoint: Path | None = None,
) -> TrainResult:
    """Train config (default tiny-lm) on text (default the shipped corpus named `corpus`);
    deterministic given settings.seed and settings.threads. `model`: start from these weights
    (trained in place, its config replaces `config`) instead of a random init, e.g. an
    upcycled model. checkpoint: a file to resume from, if there, and to write the run's
    state to every checkpoint_every(settings.steps) steps."""
    config = model.config if model is not None else config or get_lm_preset("tiny-lm")
    settings = settings or TrainSettings()
    tokenizer = tokenizer or ByteTokenizer(vocab_size=config.vocab_size)
    if settings.seq_len > config.max_position_embeddings:
        raise UsageError(f"seq_len {settings.seq_len} exceeds the model's context {config.max_position_embeddings}")
    source = "a given text"
    if text is None:
        text, source = shipped_text(corpus), CORPORA[corpus][1]
    train_ids, val_ids = split_text(text, tokenizer, settings.val_fraction)

    with deterministic_threads(settings.threads):
        torch.manual_seed(settings.seed)
        if model is None:
            model = DeaMoELM.random(config, seed=settings.seed)
        result = _train(model, tokenizer, train_ids, val_ids, settings, progress, label, checkpoint)
    result.text_source = source
    return result


def _train(model, tokenizer, train_ids, val_ids, settings: TrainSettings, progress: bool, label: str, checkpoint):
    if settings.fsdp and world()[1] > 1:
        with sharded(model, [f"layers.{i}" for i in range(len(model.layers))], root=True) as work:
            result = _train_loop(work, tokenizer, train_ids, val_ids, settings, progress, label, checkpoint)
        result.model = model.eval()  # the trained values, gathered back whole
        return result
    return _train_loop(model, tokenizer, train_ids, val_ids, settings, progress, label, checkpoint)


def _train_loop(model, tokenizer, train_ids, val_ids, settings: TrainSettings, progress: bool, label: str, checkpoint):
    start = time.perf_counter()
    initial_val = evaluate(model, val_ids, settings)
    fsdp = settings.fsdp and world()[1] > 1
    if fsdp:
        model.reshard()  # a root keeps its gathered weights after a forward: the optimizer takes the shards
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.lr,
        betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(settings.seed)
    rank, size = world()
    if settings.batch_size < size:
        raise UsageError(f"the batch ({settings.batch_size} windows) must be at least the {size} processes")
    bar = Progress(settings.steps, label, enabled=progress and rank == 0)
    losses: list[float] = []
    num_experts = model.config.moe.num_experts
    params = list(model.parameters())
    first, every = 0, checkpoint_every(settings.steps)
    expected = {"settings": dataclasses.asdict(settings)}
    if checkpoint is not None:
        meta = load_training_state(checkpoint, "training", expected, params, optimizer, gen)
        if meta is not None:
            first, losses[:], initial_val = int(meta["step"]), meta["losses"], float(meta["initial_val_loss"])
            bar.update(f"resumed at step {first}", step=first)
    model.train()
    for step in range(first, settings.steps):
        for group in optimizer.param_groups:
            group["lr"] = _lr(step, settings)
        x, y = windows(train_ids, settings.batch_size, settings.seq_len, gen)
        if size == 1:
            out = model(x)
            ce = F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), y.reshape(-1))
            aux = sum(load_balance_loss(r, num_experts) for r in out.routings) / len(out.routings)
        else:
            out = model(x[rank::size])
            tokens = x.numel()
            logits = out.logits.reshape(-1, out.logits.shape[-1])
            ce = F.cross_entropy(logits, y[rank::size].reshape(-1), reduction="sum") / tokens
            parts = [global_load_balance_loss(r, num_experts, tokens) for r in out.routings]
            aux = sum(parts) / len(out.routings)
        optimizer.zero_grad(set_to_none=True)
        (ce + settings.aux_loss_coef * aux).backward()
        if size > 1:
            sum_across_ranks([] if fsdp else params, ce)  # FSDP summed the gradients itself
        torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
        optimizer.step()
        losses.append(ce.item())
        done = step + 1
        if checkpoint is not None and (rank == 0 or fsdp) and done % every == 0 and done < settings.steps:
            meta = {"step": done, "losses": losses, "initial_val_loss": initial_val, **expected}
            save_training_state(checkpoint, "training", meta, params, optimizer, gen, write=rank == 0)
        last = step + 1 == settings.steps
        if (step + 1) % settings.log_every == 0 or last:
            window = losses[-settings.log_every :]
            bar.update(f"loss {sum(window) / len(window):.3f}", step=step + 1 - bar.done)
    tail = losses[-max(1, settings.steps // 10) :]
    val = evaluate(model, val_ids, settings)
    model.eval()
    return TrainResult(
        model=model,
        tokenizer=tokenizer,
        initial_val_loss=initial_val,
        train_loss=sum(tail) / len(tail),
        val_loss=val,
        losses=losses,
        seconds=time.perf_counter() - start,
    )


def _lr(step: int, s: TrainSettings) -> float:
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    progress = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def save_trained(result: TrainResult, settings: TrainSettings, directory: str | Path) -> Path:
    return result.model.save_pretrained(directory, tokenizer=result.tokenizer, training=result.summary(settings))
