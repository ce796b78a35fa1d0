"""The `convert` workflow: a checkpoint of a trained vanilla MoE (layer, stack or language
model) converted into a new checkpoint of the same kind, with the report the command prints.

`convert_checkpoint` is the one entry point (the command parses its flags into a
`ConvertRequest` and calls it). Method "deamoe" converts (convert.run.convert_model, or a
language model without baselines or healing block by block, convert.blockwise); "pruned"
and "top-k" write one of the report's alternatives instead (convert.run.alternative_model).
Every output is checked before any work, and written whole beside its place before it takes
it (_io.replaced_directory); the finished pieces wait in OUTPUT.work until then, so a killed
run rerun with the same request resumes there. Under several processes every one converts
and the first one writes.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .._io import atomic_write_text
from ..errors import UsageError

METHODS = ("deamoe", "pruned", "top-k")
# The DeaMoE conversion's own options (request field -> flag): what methods pruned and top-k do not take.
CONVERSION_FLAGS = {
    "departments": "--departments",
    "top_departments": "--top-departments",
    "shared_size": "--shared-size",
    "shared_fraction": "--shared-fraction",
    "private_size": "--private-size",
    "department_score": "--department-score",
    "plot": "--plot",
}


@dataclass(frozen=True)
class ConvertRequest:
    """What one run was asked: the command's flags as plain values (None: not given)."""

    source: str
    output: str
    departments: int | None = None
    top_departments: int | None = None
    shared_size: int | None = None
    shared_fraction: float | None = None
    private_size: int | None = None
    method: str = "deamoe"
    keep_fraction: float | None = None  # method pruned
    top_k: int | None = None  # method top-k
    grouping: str = "cluster"
    department_score: str | None = None
    data: str | None = None
    calibration: str | None = None
    data_tokens: int | None = None
    heldout_fraction: float = 0.1
    heldout_windows: int | None = None
    calibration_tokens: int = 4096
    heal_steps: int = 0
    heal_lr: float = 1e-3
    heal_batch: int = 8
    heal_checkpoint: str | None = None
    checkpoint_every: int = 0
    heal_device: str = "cpu"
    fsdp: bool = False
    report: str | None = None
    plot: str | None = None
    no_compare: bool = False
    lm_eval: int | None = None  # documents per task; 0: all
    threads: int = 1
    seed: int = 0
    force: bool = False


def convert_checkpoint(request: ConvertRequest, *, note: Callable[[str], None] | None = None) -> int:
    """Convert request.source into request.output, printing the report and what was written;
    0 when done. note(text) hears of an output replaced. Bad input raises UsageError."""
    from ..train.determinism import deterministic_threads
    from .distill import world

    with deterministic_threads(request.threads):
        code = _run(request, note)
        if code == 0 and request.lm_eval is not None and world()[0] == 0:
            _lm_eval(request)
        return code


def _lm_eval(request: ConvertRequest) -> None:
    """The local lm-eval tasks on the source and the written model; into the report."""
    import tempfile

    from ..hf.lm_eval_task import run_local_tasks
    from ..lm.checkpoint import load_lm

    source, converted = load_lm(request.source), load_lm(request.output)
    models = {"source": source.model, "converted": converted.model}
    with tempfile.TemporaryDirectory(prefix="deamoe-lm-eval-") as folder:
        results = run_local_tasks(models, converted.tokenizer, folder, limit=request.lm_eval or None)
    for name, tasks in results.items():
        for task, metrics in tasks.items():
            print(f"lm-eval {name} {task}: " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items())))
    if request.report:
        report = json.loads(Path(request.report).read_text())
        report["lm_eval"] = {"limit": request.lm_eval or None, "results": results}
        atomic_write_text(request.report, json.dumps(report, indent=2) + "\n")
        print(f"wrote {request.report} (with lm-eval)")


def _run(request: ConvertRequest, note) -> int:
    import torch

    from ..lm.checkpoint import read
    from ..work_folder import work_dir
    from .core import ConvertSettings
    from .distill import init_distributed
    from .metrics import STEP_TOKENS
    from .report import frontier_plot_path, report_table, write_frontier_plot, write_plot
    from .run import SWEEP, convert_model
    from .sharding import fsdp_requested
    from .sources import HELDOUT_WINDOWS, lm_source, read_calibration_tensor, read_text, stack_source

    found = read(request.source)
    is_lm = found.artifact == "lm"
    if request.lm_eval is not None:  # before the conversion, not after it
        from ..hf.lm_eval_task import check_tokenizer

        if not is_lm:
            raise UsageError("--lm-eval evaluates language models; the source is a layer checkpoint")
        check_tokenizer(found.header["tokenizer"])
    ours = _check_outputs(request, is_lm)
    request, size = check_method(request, found.config.moe if is_lm else found.config)
    torch.manual_seed(request.seed)
    settings = ConvertSettings(
        departments=request.departments,
        top_departments=request.top_departments,
        shared_size=request.shared_size,
        shared_fraction=request.shared_fraction,
        private_size=request.private_size,
        grouping=request.grouping,
        department_score=request.department_score,
        heal_steps=request.heal_steps,
        heal_lr=request.heal_lr,
        heal_batch=request.heal_batch,
        heal_checkpoint=request.heal_checkpoint,
        heal_checkpoint_every=request.checkpoint_every,
        heal_device=request.heal_device,
        heal_fsdp=fsdp_requested(request.fsdp),
        seed=request.seed,
    )
    rank, _ = init_distributed(request.heal_device)
    if request.heal_device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--heal-device cuda: no CUDA device is visible")
    data = None
    if is_lm:
        from ..train.lm import shipped_text

        text: str | torch.Tensor
        header = found.header
        if request.data:
            from .data import read_tokens

            window = min(128, header["config"].max_position_embeddings - 1) + 1
            data = read_tokens(
                request.data,
                header["tokenizer"],
                budget=request.data_tokens,
                heldout_fraction=request.heldout_fraction,
                window=window,
            )
            text = data.ids
        elif not request.calibration:
            text = shipped_text()
        elif request.calibration.endswith(".safetensors"):
            text = read_calibration_tensor(request.calibration, "input_ids")
        else:
            text = read_text(request.calibration)
        if request.no_compare and not request.heal_steps and not request.plot:
            return _run_blockwise(request, settings, text, data)
        loaded = found.lm()
        for i in loaded.model.moe_layers():  # dense blocks stay as they are
            settings.check(loaded.model.layers[i].mlp.config)
        source = lm_source(
            loaded.model,
            loaded.tokenizer,
            text,
            heldout_fraction=request.heldout_fraction,
            heal_on_all=data is not None,
            heldout_windows=request.heldout_windows or HELDOUT_WINDOWS,
        )
    else:
        if request.data:
            raise UsageError("--data takes text for a language model; give a layer --calibration hidden_states")
        stack = found.stack()
        settings.check(stack.config)
        hidden = read_calibration_tensor(request.calibration, "hidden_states") if request.calibration else None
        source = stack_source(stack, hidden, seed=request.seed, tokens=request.calibration_tokens)

    tokenizer = loaded.tokenizer if is_lm else None
    if size is not None:
        return _write_alternative(request, source, settings, size, ours, tokenizer, data, note)
    sweep = SWEEP if request.plot else ()
    work = work_dir(request.output)
    result, report = convert_model(
        source,
        settings,
        compare=not request.no_compare,
        sweep=sweep,
        progress=rank == 0,
        work=str(work),
        work_writer=rank == 0,
    )
    if rank != 0:  # every process converted the same; the first one writes
        return 0
    report["source"]["path"] = str(request.source)
    if data is not None:
        report["data"] = data.summary
    kept = [r for r in report["rows"] if r["method"] == "source" or r["shared_fraction"] == result.fraction]
    summary = {
        "converted_from": str(request.source),
        "source": report["source"],
        "expert_order": [order.tolist() for order in result.orders],
        "report": [r for r in kept if r["method"] in ("source", result.name)],
    }
    _save_converted(request, ours, note, is_lm, result, tokenizer, summary)
    print(report_table(report, fraction=result.fraction))
    if request.report:
        atomic_write_text(request.report, json.dumps(report, indent=2) + "\n")
        print(f"wrote {request.report}")
    shutil.rmtree(work, ignore_errors=True)  # the finished pieces, once every output is written
    if request.plot:
        for tokens in STEP_TOKENS:
            print()
            print(report_table(report, tokens=tokens))
        write_plot(report, request.plot)
        print(f"wrote {request.plot}")
        print(f"wrote {write_frontier_plot(report, frontier_plot_path(request.plot))}")
    print(f"wrote {request.output} ({result.name}, department score {result.layers[0].config.department_score})")
    return 0


def _save_converted(request: ConvertRequest, ours, note, is_lm: bool, converted, tokenizer, summary: dict) -> None:
    """Write the converted model (its .lm with the tokenizer, or its .layers as a stack) to
    request.output, replacing it only when ours or forced; summary: its provenance."""
    from .._io import replaced_directory

    what = "language-model checkpoint" if is_lm else "layer checkpoint"
    with replaced_directory(request.output, ours, what, force=request.force, note=note) as staging:
        if is_lm:
            converted.lm.save_pretrained(staging, tokenizer=tokenizer, training={"conversion": summary})
        else:
            from ..layer import DeaMoEStack

            stack = DeaMoEStack.from_layers(converted.layers)
            stack.source = summary
            stack.save_pretrained(staging)


def _check_outputs(request: ConvertRequest, is_lm: bool):
    """The output and reports checked before any work: none of them the source or inside it,
    and an existing output directory replaceable (ours, of the same kind, or force). The
    test of "ours" for the output's kind."""
    from .._io import check_not_input, check_replaceable, json_format_is
    from ..checkpoint import FORMAT
    from ..lm.checkpoint import FORMAT as LM_FORMAT

    for flag, path in (("-o", request.output), ("--report", request.report), ("--plot", request.plot)):
        if path:
            check_not_input(path, [request.source], flag=flag)
    ours = json_format_is(LM_FORMAT if is_lm else FORMAT)
    what = "language-model checkpoint" if is_lm else "layer checkpoint"
    check_replaceable(request.output, ours, what, force=request.force)
    return ours


def _run_blockwise(request: ConvertRequest, settings, text, data) -> int:
    """A language model without baselines or healing: one block at a time, resumable."""
    from .blockwise import convert_lm_blockwise

    summary = convert_lm_blockwise(
        request.source, request.output, settings, text, heldout_fraction=request.heldout_fraction
    )
    if request.report:
        report = {**summary, **({"data": data.summary} if data is not None else {})}
        atomic_write_text(request.report, json.dumps(report, indent=2) + "\n")
        print(f"wrote {request.report}")
    errors = ", ".join(f"{e:.4f}" for e in summary["relative_error"])
    print(f"held-out FFN relative error per block: {errors}")
    print(f"wrote {request.output} (converted block by block, department score {summary['department_score']})")
    return 0


def check_method(request: ConvertRequest, moe) -> tuple[ConvertRequest, int | None]:
    """One-line refusals of options that do not fit request.method. For pruned and top-k, the
    request with one department and nothing shared (so the shared data path runs unchanged)
    and the size (neurons per expert, or k); for deamoe, the request and None."""
    if request.method == "deamoe":
        for flag, given in (("--keep-fraction", request.keep_fraction), ("--top-k", request.top_k)):
            if given is not None:
                raise UsageError(f"{flag} takes --method pruned or top-k; the DeaMoE conversion does not use it")
        flags = (("--departments", request.departments), ("--top-departments", request.top_departments))
        missing = [flag for flag, value in flags if value is None]
        if request.shared_size is None and request.shared_fraction is None:
            missing.append("--shared-size or --shared-fraction")
        if missing:
            raise UsageError(f"convert needs {', '.join(missing)} (or --method pruned|top-k)")
        return request, None
    for field, flag in CONVERSION_FLAGS.items():
        if getattr(request, field) is not None:
            raise UsageError(f"{flag} is the DeaMoE conversion's; --method {request.method} does not take it")
    if request.no_compare:
        raise UsageError(f"--no-compare: --method {request.method} writes one model and compares no baselines")
    f, k = moe.expert_intermediate_size, moe.top_k
    if moe.shared_intermediate_size:
        raise UsageError(
            f"the source already has department shared parts (f_s = {moe.shared_intermediate_size}); "
            f"--method {request.method} takes a vanilla MoE (f_s = 0)"
        )
    if request.method == "pruned":
        if request.keep_fraction is None:
            raise UsageError("--method pruned needs --keep-fraction X (0 < X < 1)")
        if request.top_k is not None:
            raise UsageError("--top-k takes --method top-k, not pruned")
        size = round(request.keep_fraction * f)
        if not 0 < size < f:
            raise UsageError(f"--keep-fraction {request.keep_fraction} keeps {size} of {f} neurons; keep 1 to {f - 1}")
    else:
        if request.top_k is None:
            raise UsageError(f"--method top-k needs --top-k K (below the source's top-{k})")
        if request.keep_fraction is not None:
            raise UsageError("--keep-fraction takes --method pruned, not top-k")
        if request.top_k >= k:
            raise UsageError(f"--top-k {request.top_k} must be below the source's top-{k}")
        size = request.top_k
    return dataclasses.replace(request, departments=1, top_departments=1, shared_size=0), size


def _write_alternative(request: ConvertRequest, source, settings, size: int, ours, tokenizer, data, note) -> int:
    """Build (resumably, in OUTPUT.work), write the checkpoint and, with a report, its report."""
    from ..work_folder import work_dir
    from .distill import world
    from .report import report_table
    from .run import alternative_model

    rank = world()[0]
    work = work_dir(request.output)
    variant, report = alternative_model(
        source, settings, request.method, size, progress=rank == 0, work=str(work), work_writer=rank == 0
    )
    if rank != 0:
        return 0
    report["source"]["path"] = str(request.source)
    if data is not None:
        report["data"] = data.summary
    summary = {"converted_from": str(request.source), "source": report["source"], **report["settings"]}
    summary["report"] = report["rows"]
    _save_converted(request, ours, note, source.lm is not None, variant, tokenizer, summary)
    print(report_table(report))
    if request.report:
        atomic_write_text(request.report, json.dumps(report, indent=2) + "\n")
        print(f"wrote {request.report}")
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {request.output} ({variant.name}, {'k' if request.method == 'top-k' else 'f'}={size})")
    return 0
