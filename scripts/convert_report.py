"""Make docs/convert.md's numbers: train the two test MoE language models on the shipped
text and convert each with `deamoe-trt convert`, with a report and a plot.

    PYTHONPATH=. python scripts/convert_report.py --out convert-report   # ~10 CPU minutes

(a) upcycled: a dense model trained DENSE_STEPS, its FFN copied into 16 experts, then
    MoE-trained MOE_STEPS; (b) scratch: the same MoE trained DENSE_STEPS + MOE_STEPS from
    random. Both deterministic (seed 0, one thread). Existing source checkpoints in --out
    are reused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deamoe_trt.cli.main import main as cli
from deamoe_trt.convert.testmodels import make_scratch, make_upcycled, settings_for

DENSE_STEPS, MOE_STEPS = 400, 200
CONVERT = ["--departments", "4", "--shared-fraction", "0.5", "--top-departments", "1", "--heal-steps", "100"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("convert-report"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sources = {
        "upcycled": (lambda: make_upcycled(DENSE_STEPS, MOE_STEPS), MOE_STEPS, f"dense {DENSE_STEPS} steps, upcycled"),
        "scratch": (lambda: make_scratch(DENSE_STEPS + MOE_STEPS), DENSE_STEPS + MOE_STEPS, "random init"),
    }
    for name, (make, steps, start) in sources.items():
        source = args.out / f"{name}-moe"
        if not (source / "config.json").is_file():
            result = make()
            training = {**result.summary(settings_for(steps)), "start": start}
            result.model.save_pretrained(source, tokenizer=result.tokenizer, training=training)
            print(f"{name}: validation loss {result.val_loss:.3f} nats/byte -> {source}", flush=True)
        argv = ["convert", str(source), "-o", str(args.out / f"{name}-deamoe"), *CONVERT]
        argv += ["--report", str(args.out / f"{name}.json"), "--plot", str(args.out / f"{name}.png")]
        print(f"\n$ deamoe-trt {' '.join(argv)}", flush=True)
        code = cli(argv)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
