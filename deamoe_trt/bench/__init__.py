"""`deamoe-trt bench`: time DeaMoE against its expanded twin and ONNX Runtime's vanilla MoE.

    from deamoe_trt.bench import BenchOptions, run_bench, format_result
    result = run_bench(BenchOptions.quick_run())
    print(format_result(result))

See docs/benchmarks.md for the method and the JSON fields.
"""

from __future__ import annotations

import json
from pathlib import Path

from .._io import atomic_path
from .harness import SCHEMA, BenchOptions, run_bench, step_seed
from .plot import write_plot
from .tables import format_result

__all__ = ["SCHEMA", "BenchOptions", "format_result", "run_bench", "step_seed", "write_json", "write_plot"]


def write_json(result: dict, path: str | Path) -> Path:
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(result, indent=1) + "\n")
    return path
