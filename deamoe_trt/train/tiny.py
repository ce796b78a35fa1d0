"""The `train-tiny` workflow: train the tiny-lm preset on the shipped text, write the checkpoint
and print the losses and a greedy sample.

Resumable like `train` (deamoe_trt.train.compare): the run checkpoints its state in
OUTPUT.work every tenth of its steps; a killed run, rerun with the same arguments, continues
from the last checkpoint and writes the weights an uninterrupted run writes. Work of other
arguments is set aside and the run starts over; the folder is removed once the output is written.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .lm import TEXT_SOURCE, TrainSettings, save_trained, train


def run_train_tiny(output: str | Path, settings: TrainSettings, *, force: bool = False, note=None) -> int:
    """Train tiny-lm with settings (resumably), write it to output; the exit status."""
    from .. import runtimes
    from .._io import check_replaceable, json_format_is, replaced_directory
    from ..console import format_bytes, format_table
    from ..lm.checkpoint import FORMAT
    from ..runtimes.decode import generate
    from ..work_folder import fingerprint, open_work, work_dir

    out, ours, what = Path(output), json_format_is(FORMAT), "language-model checkpoint"
    check_replaceable(out, ours, what, force=force)  # before the training, not after it
    key = fingerprint([], settings, command="train-tiny")
    work = open_work(work_dir(out), key, command="train-tiny", what="training")
    print(f"training tiny-lm for {settings.steps} steps on {TEXT_SOURCE} (seed {settings.seed})")
    result = train(settings=settings, checkpoint=work.folder / "checkpoint.safetensors")
    with replaced_directory(out, ours, what, force=force, note=note) as staging:
        save_trained(result, settings, staging)
    shutil.rmtree(work.folder, ignore_errors=True)  # the checkpoint, once the output is written
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(
        format_table(
            ("loss (nats per byte)", "value"),
            [
                ("validation, before training", f"{result.initial_val_loss:.3f}"),
                ("train (last 10% of steps)", f"{result.train_loss:.3f}"),
                ("validation, after training", f"{result.val_loss:.3f}"),
            ],
            title=f"Trained in {result.seconds:.0f} s",
        )
    )
    prompt = "Anne"
    sample = generate(runtimes.get("torch").decoder(result.model), result.tokenizer.encode(prompt), 80)
    print(f"\ngreedy sample: {prompt + result.tokenizer.decode(sample.new_ids)!r}")
    print(f"\nwrote {out} ({format_bytes(size)})")
    return 0
