"""What `deamoe-trt bench` is asked to do: its options, checked, and the seed of each input."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..dtypes import BY_NAME
from ..errors import UsageError
from ..presets import get_preset

# Every contender `bench` knows, in build (and keep) order: the most informative first, so a
# tight memory budget keeps them.
PRIORITY = ("deamoe/cpu", "expanded/cpu", "vanilla/ort", "deamoe/ort", "expanded/ort", "deamoe/torch", "expanded/torch")
SCHEMA = "deamoe-trt-bench/1"


DTYPES = {name: BY_NAME[name].torch for name in ("fp32", "fp16")}


MAX_STEPS = 10_000


def step_seed(seed: int, tokens: int, step: int) -> int:
    """Seed of the input of `step` at `tokens` tokens: x = random_hidden(tokens, d, seed=...)."""
    return seed * 100_000_000 + tokens * 10_000 + step


@dataclass
class BenchOptions:
    preset: str = "qwen3-30b-a3b-layer"
    tokens: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    dtype: str = "fp32"
    steps: int = 200
    warmup: int | None = None  # default: max(3, steps // 10)
    seed: int = 0
    threads: int | None = None  # default: every core
    layers: int | str = "auto"  # multi-layer section: a count, "auto" (fits memory) or 0 (off)
    stack_dtype: str = "fp16"
    quick: bool = False
    gap_ms: float = 2.0  # busy pause before each timed call (longer after spinning runtimes)
    only: list[str] | None = None  # contender names to run (default all)
    bandwidth_bytes: int = 1 << 30
    bandwidth_passes: int = 9
    probe_bytes: int = 128 << 20  # bytes the interleaved roof probe reads per step
    memory_fraction: float = 0.8  # of MemAvailable the run may use
    ort_spinning: bool = False  # see ORT_SPINNING_COOLDOWN_S
    progress: bool = True

    @classmethod
    def quick_run(cls, **changes) -> BenchOptions:
        """Seconds, not minutes: the tiny preset, few steps, a small bandwidth buffer."""
        base = {
            "preset": "tiny",
            "tokens": [1, 3],
            "steps": 12,
            "warmup": 2,
            "layers": "auto",
            "gap_ms": 0.0,
            "bandwidth_bytes": 64 << 20,
            "bandwidth_passes": 3,
            "probe_bytes": 8 << 20,
            "quick": True,
        }
        base.update(changes)
        return cls(**base)

    def validate(self) -> None:
        if self.dtype not in DTYPES:
            raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.stack_dtype not in DTYPES:
            raise UsageError(f"--stack-dtype must be one of {', '.join(DTYPES)}, got {self.stack_dtype!r}")
        if not 1 <= self.steps <= MAX_STEPS:
            raise UsageError(f"--steps must be between 1 and {MAX_STEPS}, got {self.steps}")
        if self.warmup is not None and self.warmup < 0:
            raise UsageError(f"--warmup must be >= 0, got {self.warmup}")
        if not 0 <= self.gap_ms <= 1000:
            raise UsageError(f"--gap-ms must be between 0 and 1000, got {self.gap_ms}")
        if any(t > 9_999 for t in self.tokens):
            raise UsageError("--tokens must be below 10000")
        if self.only:
            unknown = sorted(set(self.only) - set(PRIORITY))
            if unknown:
                raise UsageError(f"unknown contender(s) {', '.join(unknown)}; choose from {', '.join(PRIORITY)}")
        get_preset(self.preset)

    @property
    def warmup_steps(self) -> int:
        return self.warmup if self.warmup is not None else max(3, self.steps // 10)
