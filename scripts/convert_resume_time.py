"""Time a `deamoe-trt convert` with baselines and healing three ways: uninterrupted, SIGKILLed
at 60% of that time, and the rerun of the killed one (same arguments), and check the rerun
wrote the uninterrupted run's bytes.

    .venv/bin/python scripts/convert_resume_time.py --out resume-time --heal-steps 300

The source is a random 2-block vanilla MoE of convert.testmodels.MOE's shape (d = 128, 16
experts of width 64, top-4), converted into 4 departments at f_s = 0.5 on the shipped text.
"""

from __future__ import annotations

import argparse
import filecmp
import signal
import subprocess
import sys
import time
from pathlib import Path

from deamoe_trt.convert.testmodels import MOE
from deamoe_trt.lm import DeaMoELM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--heal-steps", type=int, default=300)
    parser.add_argument("--kill-at", type=float, default=0.6, help="fraction of the uninterrupted time")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    src = args.out / "src"
    if not src.exists():
        DeaMoELM.random(MOE, seed=0).save_pretrained(src)
    exe = str(Path(sys.executable).with_name("deamoe-trt"))

    def convert(out: Path, kill_after: float | None = None) -> tuple[float, int]:
        argv = [exe, "convert", str(src), "-o", str(out), "--departments", "4", "--shared-fraction", "0.5"]
        argv += ["--top-departments", "2", "--heal-steps", str(args.heal_steps), "--heldout-windows", "4"]
        argv += ["--report", f"{out}.json"]
        began = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            proc.wait(kill_after)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        return time.perf_counter() - began, proc.returncode

    whole, rc = convert(args.out / "whole")
    assert rc == 0, rc
    killed, rc = convert(args.out / "resumed", kill_after=args.kill_at * whole)
    assert rc == -signal.SIGKILL, f"the run ended (exit {rc}) before it was killed"
    rerun, rc = convert(args.out / "resumed")
    assert rc == 0, rc
    whole_dir, resumed_dir = args.out / "whole", args.out / "resumed"
    same = all(filecmp.cmp(p, resumed_dir / p.name, shallow=False) for p in whole_dir.iterdir())
    same = same and filecmp.cmp(f"{whole_dir}.json", f"{resumed_dir}.json", shallow=False)
    print(
        f"uninterrupted {whole:.1f} s; killed at {killed:.1f} s; rerun {rerun:.1f} s = {rerun / whole:.0%} of "
        f"uninterrupted; identical files: {same}; work folder left: {Path(f'{resumed_dir}.work').exists()}"
    )


if __name__ == "__main__":
    main()
