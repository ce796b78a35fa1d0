"""What a validation reports, and the tolerances it holds models to (a leaf: imports no validator)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .compare import Comparison, comparison_table, nonfinite_summary

# (atol, rtol) per dtype; an element fails only when it exceeds both. Measured errors on the
# tiny and DeepSeek-style test configs are 10-100x below these (export-recipes/README.md).
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "fp32": (1e-4, 1e-3),
    "fp16": (1e-2, 1e-2),
    "bf16": (5e-2, 5e-2),
}
DEFAULT_TOKENS = (1, 4, 16)
# ONNX Runtime's CPU QMoE quantizes activations to int8 for int8 weights: measured errors are
# 0.7-1.7% of the output's scale (tests/export), against the exactly dequantized reference.
ORT_CPU_INT8_TOLERANCE = (5e-2, 5e-2)


def ort_cpu_int8_tolerances(atol: float | None, rtol: float | None) -> tuple[float, float, str]:
    """(atol, rtol, note) for an int8 ort-form model on ONNX Runtime's CPU: ORT_CPU_INT8_TOLERANCE
    unless the caller set them, and the note saying why."""
    note = (
        "note: ONNX Runtime's CPU QMoE runs 8-bit blocks with int8 activations (documented), "
        f"so int8 models are checked at atol/rtol {ORT_CPU_INT8_TOLERANCE[0]:g} there"
    )
    return (
        ORT_CPU_INT8_TOLERANCE[0] if atol is None else atol,
        ORT_CPU_INT8_TOLERANCE[1] if rtol is None else rtol,
        note,
    )


@dataclass
class ValidationReport:
    model: str
    checkpoint: str
    description: str  # e.g. "plugin form, fp16, stack of 2 layers"
    provider: str
    atol: float
    rtol: float
    rows: list[Comparison]
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    def table(self) -> str:
        title = (
            f"{self.model} ({self.description}) on {self.provider} vs the PyTorch reference of {self.checkpoint}; "
            f"atol {self.atol:g}, rtol {self.rtol:g}"
        )
        nonfinite = nonfinite_summary(self.rows)
        notes = [*([f"NaN/Inf: {nonfinite}"] if nonfinite else []), *self.notes]
        return "\n".join([comparison_table(self.rows, title=title), *notes])

    def failure(self) -> str:
        """One line on what exceeded tolerance (for DeaMoEError); NaN/Inf outputs said first."""
        nonfinite = nonfinite_summary(self.rows)
        if nonfinite:
            return nonfinite
        failed = [r for r in self.rows if not r.passed]
        worst = max(failed, key=lambda r: r.max_abs)
        return (
            f"{len(failed)} of {len(self.rows)} comparison(s) exceed tolerance "
            f"(atol {self.atol:g}, rtol {self.rtol:g}); "
            f"worst: {worst.output} at {worst.tokens} token(s), max abs error {worst.max_abs:.3e}"
        )


def tolerances(dtype: str, atol: float | None = None, rtol: float | None = None) -> tuple[float, float]:
    """(atol, rtol): the given ones, or the defaults of dtype (fp32/fp16/bf16) for those not given."""
    default_atol, default_rtol = DEFAULT_TOLERANCES[dtype]
    return (default_atol if atol is None else atol, default_rtol if rtol is None else rtol)
