"""Make docs/convert.md's numbers: train test MoE language models on shipped text and convert
each with `deamoe-trt convert`, with reports and plots.

    PYTHONPATH=. python scripts/convert_report.py --out convert-report                # ~10 CPU minutes
    PYTHONPATH=. python scripts/convert_report.py --out convert-report --fine-grained # ~2 hours, 2 cores

Default: two 2-block models on Persuasion. (a) upcycled: a dense model trained DENSE_STEPS,
its FFN copied into 16 experts, then MoE-trained MOE_STEPS; (b) scratch: the same MoE trained
DENSE_STEPS + MOE_STEPS from random.

--fine-grained: the 6-block model of convert.testmodels.FINE_GRAINED (d = 256, 32 experts of
width 128, top-4) trained from random on Jane Austen's six novels, then converted into 8
departments of 4 experts at 1, 2 and 4 departments per token, each at shared fractions
0.25 / 0.5 / 0.75, against every baseline at equal bytes per step, healed on the training
part of the text and measured on its held-out tenth (the text's last 10%, as in training).

Deterministic (seed 0). Existing source checkpoints and reports in --out are reused.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from deamoe_trt.cli.main import main as cli
from deamoe_trt.console import format_table
from deamoe_trt.convert.report import HEALED, report_table
from deamoe_trt.convert.testmodels import (
    FINE_GRAINED_CORPUS,
    FINE_GRAINED_SETTINGS,
    make_fine_grained,
    make_scratch,
    make_upcycled,
    settings_for,
)
from deamoe_trt.train.lm import shipped_text

DENSE_STEPS, MOE_STEPS = 400, 200
CONVERT = ["--departments", "4", "--shared-fraction", "0.5", "--top-departments", "1", "--heal-steps", "100"]

FINE_DEPARTMENTS, FINE_TOP_DEPARTMENTS, FINE_HEAL_STEPS = 8, (1, 2, 4), 60
FINE_CONVERT = ["--departments", str(FINE_DEPARTMENTS), "--shared-fraction", "0.5", "--threads", "2"]
FINE_CONVERT += ["--heal-steps", str(FINE_HEAL_STEPS), "--heldout-windows", "64"]


def _source(out: Path, name: str, make, settings, start: str) -> Path:
    source = out / f"{name}-moe"
    if not (source / "config.json").is_file():
        result = make()
        training = {**result.summary(settings), "start": start}
        result.model.save_pretrained(source, tokenizer=result.tokenizer, training=training)
        print(f"{name}: validation loss {result.val_loss:.3f} nats/byte -> {source}", flush=True)
    return source


def _convert(out: Path, source: Path, name: str, options: list[str]) -> int:
    if (out / f"{name}.json").is_file():
        return 0
    argv = ["convert", str(source), "-o", str(out / f"{name}-deamoe"), *options]
    argv += ["--report", str(out / f"{name}.json"), "--plot", str(out / f"{name}.png")]
    print(f"\n$ deamoe-trt {' '.join(argv)}", flush=True)
    start = time.perf_counter()
    code = cli(argv)
    print(f"{name}: {time.perf_counter() - start:.0f} s", flush=True)
    return code


def small(out: Path) -> int:
    sources = {
        "upcycled": (lambda: make_upcycled(DENSE_STEPS, MOE_STEPS), MOE_STEPS, f"dense {DENSE_STEPS} steps, upcycled"),
        "scratch": (lambda: make_scratch(DENSE_STEPS + MOE_STEPS), DENSE_STEPS + MOE_STEPS, "random init"),
    }
    for name, (make, steps, start) in sources.items():
        source = _source(out, name, make, settings_for(steps), start)
        if code := _convert(out, source, name, CONVERT):
            return code
    return 0


def fine_grained(out: Path) -> int:
    source = _source(out, "fine-grained", make_fine_grained, FINE_GRAINED_SETTINGS, "random init")
    text = out / f"{FINE_GRAINED_CORPUS}.txt"
    if not text.is_file():
        text.write_text(shipped_text(FINE_GRAINED_CORPUS), encoding="ascii")
    for top in FINE_TOP_DEPARTMENTS:
        options = [*FINE_CONVERT, "--top-departments", str(top), "--data", str(text)]
        if code := _convert(out, source, f"fine-grained-g{top}", options):
            return code
    summary = out / "fine-grained.md"
    summary.write_text(fine_grained_tables(out), encoding="utf-8")
    print(f"tables: {summary}")
    return 0


def fine_grained_tables(out: Path) -> str:
    """Markdown: the grid (departments per token x shared fraction), each run's full table at
    f_s/f = 0.5, and the converted model's per-layer routing/weights error split."""
    reports = {top: json.loads((out / f"fine-grained-g{top}.json").read_text()) for top in FINE_TOP_DEPARTMENTS}
    grid = []
    for top, report in reports.items():
        rows = report["rows"]
        source = next(r for r in rows if r["method"] == "source")

        def vs(row, source=source):
            return f"{row['perplexity'] / source['perplexity'] - 1:+.1%}"

        for fraction in sorted({r["shared_fraction"] for r in rows if r["method"] != "source"}):
            at = [r for r in rows if r["shared_fraction"] == fraction and r["method"] != "source"]
            mine = {r["method"]: r for r in at if r["method"].startswith("converted")}
            others = [r for r in at if not r["method"].startswith("converted")]
            best = min(others, key=lambda r: r["perplexity"])
            healed = mine.get("converted" + HEALED, mine["converted"])
            grid.append(
                [
                    str(top),
                    f"{fraction:.2f}",
                    f"{healed['bytes_vs_source']:.1%}",
                    vs(healed),
                    f"{healed['next_token_agreement']:.1%}",
                    vs(mine["converted"]),
                    f"{best['method']} ({best['bytes_vs_source']:.1%})",
                    vs(best),
                    str(sum(r["perplexity"] < healed["perplexity"] for r in others)),
                ]
            )
    headers = ["departments/token", "f_s/f", "bytes vs source", "healed ppl", "healed next-token agr."]
    headers += ["unhealed ppl", "best baseline (bytes)", "its ppl", "baselines better"]
    parts = [format_table(headers, grid, title="Perplexity vs the source's on held-out text", markdown=True)]
    for top, report in reports.items():
        parts.append(
            report_table(report, fraction=0.5, markdown=True).replace(
                "Conversion of", f"{top} department(s) per token:", 1
            )
        )
        layers = []
        for r in report["rows"]:
            if r["method"].startswith("converted") and r["shared_fraction"] == 0.5:
                for i, (routing, weights) in enumerate(zip(r["routing_error"], r["weights_error"], strict=True)):
                    layers.append([r["method"], str(i), f"{routing:.4f}", f"{weights:.4f}"])
        title = f"{top} department(s) per token, f_s/f = 0.5: relative error per layer"
        parts.append(
            format_table(["method", "layer", "routing err.", "weights err."], layers, title=title, markdown=True)
        )
    return "\n\n".join(parts) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("convert-report"))
    parser.add_argument("--fine-grained", action="store_true", help="the 6-block, 32-expert model instead")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    return fine_grained(args.out) if args.fine_grained else small(args.out)


if __name__ == "__main__":
    sys.exit(main())
