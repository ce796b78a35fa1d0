"""Measure from_hf's fp32 parity errors per family against the installed transformers.

    python scripts/measure_parity.py [--seeds 20]

For each family: the largest max|ours - hf| over the seeds, the same relative to max|hf|,
and how many of the tokens got exactly the same set of experts. Inputs are [2, 5, d]
random normal; weights as in the test suite (hf_util.randomize_).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

# The test suite's helpers (tests/importers/hf_util.py, hf4_layout.py) and the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import transformers
from importers.hf_util import errors, hf_block, hf_routing, id_sets, inputs

from deamoe_trt.importers.hf import from_hf

FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, fp32, {args.seeds} seeds")
    print(f"{'family':<12} {'max abs error':>14} {'max rel error':>14} {'same experts':>13}")
    for family in FAMILIES:
        worst_abs = worst_rel = 0.0
        same = total = 0
        for seed in range(args.seeds):
            block = hf_block(family, seed=seed)
            x = inputs(seed=1000 + seed)
            with torch.no_grad():
                layer = from_hf(block)
                err, rel = errors(layer(x), block(x))
                ours, theirs = id_sets(layer.route(x).expert_ids), id_sets(hf_routing(block, x)[0])
            worst_abs, worst_rel = max(worst_abs, err), max(worst_rel, rel)
            same += sum(a == b for a, b in zip(ours, theirs, strict=True))
            total += len(ours)
        print(f"{family:<12} {worst_abs:>14.3g} {worst_rel:>14.3g} {f'{same}/{total}':>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
