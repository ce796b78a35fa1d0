"""DeaMoE against a vanilla MoE of equal size, trained from the same data, seed and budget.

The paper's pretraining claim at small scale: a DeaMoE language model and a vanilla top-k
MoE with the same expert parameters and the same active FFN neurons per token (so the same
FLOPs per token) train the same number of steps on the same batches from the same seed;
the report compares their held-out perplexity and the FFN bytes a decoding step of 1, 4 and
8 tokens reads (deamoe_trt.convert.metrics, on each model's own held-out routing).

The vanilla MoE is solved from the DeaMoE's config and an expert width f_v:
    N_v f_v = D f_s + N f_p     (expert parameters, every department's shared part once)
    k_v f_v = g f_s + k f_p     (neurons a token computes: g shared parts, k private parts)
Both must come out whole; the attention, embeddings and head are the same. The routers
differ by (N - N_v) d weights per block, which the report states.

Sparse upcycling (`dense_steps`): one dense model (each FFN one SwiGLU of width f_s + f_p =
f_v) trains first; both MoEs start from it, every expert a copy of its FFN (for the DeaMoE:
each department's shared part its first f_s neurons, each private part the rest), with
fresh routers, and train the remaining steps. With weights renormalised over the kept
experts (norm_topk_prob) an upcycled model computes exactly the dense model's function at
its first step.

Resume (`work`, OUTPUT.work beside the output; deamoe_trt.work_folder): each model trained
whole is kept there as a piece, and the one in training checkpoints its state every tenth of
its steps (deamoe_trt.train.lm): a killed run, rerun with the same arguments, takes the
finished models, continues the unfinished one from its last checkpoint and ends with the
weights an uninterrupted run ends with. Work of other arguments (or another number of
processes) is set aside and the run starts over; run_comparison removes the folder once the
output is written.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn import functional as F

from ..config import DeaMoEConfig, top_k_moe
from ..convert.distill import world
from ..convert.metrics import STEP_TOKENS, departments_per_token, layer_step_bytes
from ..errors import UsageError
from ..lm.config import LMConfig
from ..lm.model import DeaMoELM
from ..lm.tokenizer import ByteTokenizer
from ..work_folder import WorkCache, fingerprint, open_work, work_dir
from .lm import CORPORA, TrainResult, TrainSettings, shipped_text, split_text, train

REPORT_FORMAT = "deamoe-trt-train-comparison"


def expert_neurons(moe: DeaMoEConfig) -> int:
    """FFN neurons of one block's experts: D f_s + N f_p."""
    return moe.num_departments * moe.shared_intermediate_size + moe.num_experts * moe.private_intermediate_size


def active_neurons(moe: DeaMoEConfig) -> int:
    """Neurons a token computes at most in one block: g f_s + k f_p."""
    return moe.top_departments * moe.shared_intermediate_size + moe.top_k * moe.private_intermediate_size


def matched_vanilla(moe: DeaMoEConfig, width: int | None = None) -> DeaMoEConfig:
    """The vanilla top-k MoE of experts of `width` (default f_s + f_p) with moe's expert
    parameters and active neurons per token; a one-line UsageError when none exists."""
    width = width or moe.expert_intermediate_size
    if moe.has_shared_experts or moe.ffn_bias:
        raise UsageError("the comparison takes DeaMoE layers without always-on shared experts or FFN biases")
    total, active = expert_neurons(moe), active_neurons(moe)
    if total % width or active % width:
        raise UsageError(
            f"no vanilla MoE of experts {width} wide matches {total} expert neurons and {active} active "
            "ones per token; choose a width dividing both"
        )
    return top_k_moe(
        hidden_size=moe.hidden_size,
        num_experts=total // width,
        intermediate_size=width,
        top_k=active // width,
        score_func=moe.score_func,
        norm_topk_prob=moe.norm_topk_prob,
        routed_scaling_factor=moe.routed_scaling_factor,
        activation=moe.activation,
    )


@dataclass(frozen=True)
class ComparePreset:
    config: LMConfig  # the DeaMoE language model
    settings: TrainSettings
    dense_steps: int  # steps of the dense model before upcycling
    corpus: str = "persuasion"
    heldout_windows: int = 32
    description: str = ""

    def vanilla(self) -> LMConfig:
        return self.config.replace(moe=matched_vanilla(self.config.moe))

    def dense(self) -> LMConfig:
        width = self.config.moe.expert_intermediate_size
        return self.config.replace(
            moe=top_k_moe(
                hidden_size=self.config.hidden_size,
                num_experts=1,
                intermediate_size=width,
                top_k=1,
                norm_topk_prob=True,
            )
        )


def _lm(hidden: int, layers: int, heads: int, context: int, moe: DeaMoEConfig) -> LMConfig:
    return LMConfig(
        vocab_size=256,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=context,
        moe=moe,
    )


def _deamoe(
    hidden: int, departments: int, per_department: int, shared: int, private: int, k: int, g: int
) -> DeaMoEConfig:
    return DeaMoEConfig(
        hidden_size=hidden,
        num_departments=departments,
        experts_per_department=per_department,
        shared_intermediate_size=shared,
        private_intermediate_size=private,
        top_k=k,
        top_departments=g,
        norm_topk_prob=True,
    )


PRESETS: dict[str, ComparePreset] = {
    # Seconds: the tests' models.
    "micro": ComparePreset(
        config=_lm(32, 1, 2, 32, _deamoe(32, 2, 4, 8, 8, 3, 1)),
        settings=TrainSettings(steps=6, batch_size=4, seq_len=16, lr=1e-2, warmup=2, eval_batches=2, log_every=3),
        dense_steps=2,
        heldout_windows=4,
        description="d=32, 1 block; DeaMoE 2 departments of 4 experts (f_s=f_p=8), top-3 from 1 department",
    ),
    # A CPU core, tens of minutes: 2 blocks, d = 128. DeaMoE: 4 departments of 4 experts,
    # f_s = f_p = 48, a token's 4 experts from the top 2 departments (at most 2 x 48 + 4 x 48
    # = 288 neurons); vanilla: 10 experts of 96, top-3 (288 neurons); 960 expert neurons
    # per block each.
    "small": ComparePreset(
        config=_lm(128, 2, 4, 128, _deamoe(128, 4, 4, 48, 48, 4, 2)),
        settings=TrainSettings(steps=600, batch_size=16, seq_len=128, lr=3e-3, warmup=30, eval_batches=4, log_every=25),
        dense_steps=200,
        heldout_windows=64,
        description="d=128, 2 blocks; DeaMoE 4 departments of 4 experts (f_s=f_p=48), top-4 from 2 departments",
    ),
}


def get_preset(name: str) -> ComparePreset:
    if name not in PRESETS:
        raise UsageError(f"unknown comparison preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]


@torch.no_grad()
def upcycle(dense: DeaMoELM, config: LMConfig, *, seed: int = 0) -> DeaMoELM:
    """config's MoE language model starting from dense (every FFN one expert of width f_s +
    f_p): each department's shared part is the dense FFN's first f_s neurons, each private
    part the rest; routers random (seed), everything else copied."""
    dense_moe, moe = dense.config.moe, config.moe
    if dense_moe.num_experts != 1 or dense_moe.expert_intermediate_size != moe.expert_intermediate_size:
        raise UsageError(
            f"upcycling needs a dense model of one FFN {moe.expert_intermediate_size} wide, "
            f"got {dense_moe.num_experts} experts {dense_moe.expert_intermediate_size} wide"
        )
    model = DeaMoELM.random(config, seed=seed)
    state = dense.state_dict()
    f_s = moe.shared_intermediate_size
    for name, tensor in model.state_dict().items():
        if ".mlp.router." in name:
            continue
        if ".mlp.departments." in name or ".mlp.experts." in name:
            block = name.split(".mlp.")[0]
            gate_up = state[f"{block}.mlp.experts.gate_up"][0]  # [2f, d]: gate rows, then up rows
            down = state[f"{block}.mlp.experts.down"][0]  # [d, f]
            f = down.shape[1]
            gate, up = gate_up[:f], gate_up[f:]
            part = slice(0, f_s) if ".mlp.departments." in name else slice(f_s, f)
            source = torch.cat([gate[part], up[part]]) if name.endswith("gate_up") else down[:, part]
            tensor.copy_(source.expand_as(tensor))
        else:
            tensor.copy_(state[name])
    return model


def parameter_count(model: DeaMoELM) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def heldout_measures(model: DeaMoELM, heldout: torch.Tensor, windows: int, seq_len: int) -> dict:
    """Held-out loss and perplexity on up to `windows` consecutive windows of seq_len + 1
    tokens of heldout, and the FFN bytes per step (all blocks) at STEP_TOKENS tokens on
    the model's routing of those tokens."""
    count = min(windows, (len(heldout) - 1) // seq_len)
    if count < 1:
        raise UsageError(f"the held-out text ({len(heldout)} tokens) is shorter than one window of {seq_len + 1}")
    starts = torch.arange(count) * seq_len
    chunk = torch.stack([heldout[s : s + seq_len + 1] for s in starts.tolist()])
    model.eval()
    out = model(chunk[:, :-1])
    loss = F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), chunk[:, 1:].reshape(-1)).item()
    layers = [model.layers[i].mlp for i in model.moe_layers()]
    per_step = {
        str(t): sum(layer_step_bytes(layer, r, t) for layer, r in zip(layers, out.routings, strict=True))
        for t in STEP_TOKENS
    }
    return {
        "heldout_tokens": count * seq_len,
        "heldout_loss": loss,
        "perplexity": math.exp(loss),
        "bytes_per_step_at": per_step,
        "departments_per_token": sum(departments_per_token(r) for r in out.routings) / len(out.routings),
    }


def _row(name: str, result: TrainResult, preset: ComparePreset, settings: TrainSettings, steps: dict) -> dict:
    model, moe = result.model, result.model.config.moe
    router_parameters = 0
    for i in model.moe_layers():
        router_parameters += model.layers[i].mlp.router.weight.numel()
    row = {
        "model": name,
        "steps": steps,
        "parameters": parameter_count(model),
        "router_parameters": router_parameters,
        "expert_neurons_per_block": expert_neurons(moe),
        "active_neurons_per_token": active_neurons(moe),
        "experts": moe.num_experts,
        "top_k": moe.top_k,
        "departments": moe.num_departments,
        "shared_size": moe.shared_intermediate_size,
        "private_size": moe.private_intermediate_size,
        "train_loss": result.train_loss,
        "val_loss": result.val_loss,
        "seconds": result.seconds,
    }
    _, heldout = split_text(shipped_text(preset.corpus), result.tokenizer, settings.val_fraction)
    row.update(heldout_measures(model, heldout, preset.heldout_windows, settings.seq_len))
    return row


def compare(
    preset: ComparePreset,
    *,
    steps: int | None = None,
    dense_steps: int | None = None,
    upcycled: bool = False,
    scratch: bool = True,
    seed: int = 0,
    threads: int = 1,
    progress: bool = True,
    fsdp: bool = False,
    work: Path | None = None,
    work_writer: bool = True,
) -> tuple[dict, dict[str, DeaMoELM]]:
    """Train the DeaMoE and its matched vanilla MoE from scratch (and, with upcycled, both
    from one dense model; without scratch, only those), the same steps in all; (report,
    models by name). Runs as one
    process or as every process of a torchrun job (deamoe_trt.train.lm's data parallelism):
    every process returns the same report and weights, within float rounding; fsdp: sharded
    over the processes. work: the folder to resume from and keep the finished models and the
    checkpoints in (written by the process with work_writer)."""
    settings = dataclasses.replace(
        preset.settings, steps=steps or preset.settings.steps, seed=seed, threads=threads, fsdp=fsdp
    )
    dense_steps = preset.dense_steps if dense_steps is None else dense_steps
    if not (scratch or upcycled):
        raise UsageError("nothing to train: ask for the models from scratch, upcycled ones, or both")
    if upcycled and not 0 < dense_steps < settings.steps:
        raise UsageError(f"dense steps must be between 1 and the {settings.steps} steps - 1, got {dense_steps}")
    configs = {"deamoe": preset.config, "vanilla": preset.vanilla()}
    tokenizer = ByteTokenizer(vocab_size=preset.config.vocab_size)
    text = shipped_text(preset.corpus)
    cache = None
    if work is not None:
        more = {"preset": dataclasses.asdict(preset), "dense_steps": dense_steps, "upcycled": upcycled}
        key = fingerprint([], settings, command="train", scratch=scratch, processes=world()[1], **more)
        cache = _open_work(work, key, work_writer, progress)

    def trained(name: str, run: Callable[[Path | None], TrainResult]) -> TrainResult:
        if cache is None:
            return run(None)
        return _trained(cache, name, run)

    def fresh(config: LMConfig, settings: TrainSettings, label: str) -> Callable[[Path | None], TrainResult]:
        return lambda at: train(
            config, settings, text=text, tokenizer=tokenizer, progress=progress, label=label, checkpoint=at
        )

    def upcycled_from(
        dense: DeaMoELM, config: LMConfig, settings: TrainSettings, label: str
    ) -> Callable[[Path | None], TrainResult]:
        return lambda at: train(
            settings=settings,
            text=text,
            tokenizer=tokenizer,
            model=upcycle(dense, config, seed=seed),
            progress=progress,
            label=label,
            checkpoint=at,
        )

    rows, models = [], {}
    for name, config in configs.items() if scratch else ():
        result = trained(name, fresh(config, settings, f"train {name}"))
        rows.append(_row(name, result, preset, settings, {"moe": settings.steps}))
        models[name] = result.model
    if upcycled:
        first = dataclasses.replace(settings, steps=dense_steps)
        dense = trained("dense", fresh(preset.dense(), first, "train dense"))
        rows.append(_row("dense", dense, preset, first, {"dense": dense_steps}))
        models["dense"] = dense.model
        rest = dataclasses.replace(settings, steps=settings.steps - dense_steps)
        for name, config in configs.items():
            result = trained(f"{name}-upcycled", upcycled_from(dense.model, config, rest, f"train {name} (upcycled)"))
            steps_taken = {"dense": dense_steps, "moe": rest.steps}
            rows.append(_row(f"{name}-upcycled", result, preset, rest, steps_taken))
            models[f"{name}-upcycled"] = result.model
    report = {
        "format": REPORT_FORMAT,
        "corpus": preset.corpus,
        "text": CORPORA[preset.corpus][1],
        "description": preset.description,
        "settings": {
            "steps": settings.steps,
            "batch_size": settings.batch_size,
            "seq_len": settings.seq_len,
            "lr": settings.lr,
            "seed": seed,
            "threads": threads,
            "dense_steps": dense_steps if upcycled else 0,
        },
        "step_tokens": list(STEP_TOKENS),
        "rows": rows,
    }
    return report, models


def _open_work(work: Path, key: str, writer: bool, progress: bool) -> WorkCache:
    import torch.distributed as dist

    distributed = world()[1] > 1
    if distributed and not writer:
        dist.barrier()  # the writer makes or clears the folder first: no half-made folder seen
    log = sys.stderr if progress else io.StringIO()
    cache = open_work(work, key, writer=writer, log=log, command="train", what="training comparison")
    if distributed and writer:
        dist.barrier()
    return cache


def _trained(cache: WorkCache, name: str, run: Callable[[Path | None], TrainResult]) -> TrainResult:
    """The model `name` trained by run (given its checkpoint file), or as a finished run kept it."""
    checkpoint = cache.folder / f"{name}.checkpoint.safetensors"

    def pack(result: TrainResult) -> tuple[dict[str, torch.Tensor], dict]:
        meta = {f: getattr(result, f) for f in ("initial_val_loss", "train_loss", "val_loss", "losses", "seconds")}
        meta.update(text_source=result.text_source, config=result.model.config.to_dict())
        return dict(result.model.state_dict()), meta

    def unpack(tensors: dict[str, torch.Tensor], meta: dict) -> TrainResult:
        model = DeaMoELM(LMConfig.from_dict(meta.pop("config")))
        model.load_state_dict({k: v for k, v in tensors.items() if not k.startswith("__")})
        vocab = model.config.vocab_size
        return TrainResult(model=model.eval(), tokenizer=ByteTokenizer(vocab_size=vocab), **meta)

    result = cache.piece(name, lambda: run(checkpoint), pack, unpack)
    if cache.writer:
        checkpoint.unlink(missing_ok=True)  # the finished model is kept whole now
    return result


def run_comparison(
    output: str | Path,
    *,
    preset_name: str,
    text: str | None = None,
    steps: int | None = None,
    dense_steps: int | None = None,
    upcycled: bool = False,
    scratch: bool = True,
    seed: int = 0,
    threads: int = 1,
    fsdp: bool = False,
    force: bool = False,
    note=None,
) -> int:
    """`deamoe-trt train`: compare (resumably, in OUTPUT.work), then write one checkpoint per
    model and report.json to output (process 0); the exit status."""
    from .._io import check_replaceable, json_format_is, replaced_directory
    from ..convert.distill import init_distributed
    from ..convert.sharding import fsdp_requested

    out = Path(output)
    ours, what = json_format_is(REPORT_FORMAT, "report.json"), "training comparison"
    check_replaceable(out, ours, what, force=force)  # before the training, not after it
    rank, size = init_distributed("cpu")
    preset = get_preset(preset_name)
    if text:
        preset = dataclasses.replace(preset, corpus=text)
    if rank == 0:
        print(f"training a DeaMoE LM and its matched vanilla MoE ({preset.description}) on {size} process(es)")
    work = work_dir(out)
    report, models = compare(
        preset,
        steps=steps,
        dense_steps=dense_steps,
        upcycled=upcycled,
        scratch=scratch,
        seed=seed,
        threads=threads,
        progress=rank == 0,
        fsdp=fsdp_requested(fsdp),
        work=work,
        work_writer=rank == 0,
    )
    report["settings"]["processes"] = size
    if rank == 0:
        with replaced_directory(out, ours, what, force=force, note=note) as staging:
            for name, model in models.items():
                model.save_pretrained(staging / name)
            (staging / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        shutil.rmtree(work, ignore_errors=True)  # the finished pieces, once the output is written
        print(report_table(report))
        print(f"\nwrote {out}")
    return 0


def report_table(report: dict, *, markdown: bool = False) -> str:
    """One row per model: parameters, active neurons, held-out perplexity and bytes per step
    at each token count, the latter against the vanilla MoE trained the same way."""
    from ..console import format_bytes, format_table

    rows = report["rows"]
    by_name = {r["model"]: r for r in rows}
    headers = ["model", "parameters", "expert neurons/block", "active neurons/token", "held-out ppl"]
    headers += [f"bytes/step at {t}" for t in report["step_tokens"]]
    out = []
    for r in rows:
        base = by_name.get("vanilla-upcycled" if r["model"].endswith("-upcycled") else "vanilla")
        cells = [
            r["model"],
            f"{r['parameters']:,}",
            str(r["expert_neurons_per_block"]),
            str(r["active_neurons_per_token"]),
            f"{r['perplexity']:.3f}",
        ]
        for t in report["step_tokens"]:
            value = r["bytes_per_step_at"][str(t)]
            ratio = (
                ""
                if base is None or r is base or r["model"] == "dense"
                else f" ({value / base['bytes_per_step_at'][str(t)]:.1%})"
            )
            cells.append(format_bytes(value) + ratio)
        out.append(cells)
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "| --- |" + " ---: |" * (len(headers) - 1)]
        lines += ["| " + " | ".join(c) + " |" for c in out]
        return "\n".join(lines)
    return format_table(headers, out, title="held-out perplexity and FFN bytes per decoding step (vs the vanilla MoE)")
