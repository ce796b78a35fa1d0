"""One comparison: run the model's and the reference's runners on the same feeds, tabulate the errors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from polygraphy.backend.base import BaseRunner
from polygraphy.comparator import Comparator
from polygraphy.exception import PolygraphyException
from polygraphy.logger import G_LOGGER

from ..console import format_table
from ..errors import DeaMoEError


@dataclass(frozen=True)
class Comparison:
    """Errors of one output on one feed (tokens = the feed's token count)."""

    output: str
    tokens: int
    max_abs: float
    max_rel: float  # elementwise, over |reference|: large wherever the reference is near 0
    mean_abs: float
    max_abs_scaled: float  # max_abs / max |reference|: the error relative to the output's scale
    passed: bool
    nonfinite: int = 0  # NaN/Inf values in the model's output
    reference_nonfinite: int = 0  # ... and in the reference's (normally 0: inputs are finite)


def compare(
    model: BaseRunner, reference: BaseRunner, feeds: Sequence[dict[str, np.ndarray]], *, atol: float, rtol: float
) -> list[Comparison]:
    """Run both runners on every feed through polygraphy's Comparator; one Comparison per output and feed.

    An element passes when |model - reference| <= atol or <= rtol * |reference| (polygraphy's
    elementwise check); an output passes when all its elements do."""
    with G_LOGGER.verbosity(G_LOGGER.CRITICAL):
        try:
            results = Comparator.run([model, reference], data_loader=list(feeds))
            accuracy = Comparator.compare_accuracy(results, compare_func=_simple(atol=atol, rtol=rtol))
        except PolygraphyException as exc:
            raise DeaMoEError(f"comparison failed: {' '.join(str(exc).split())}") from None
    if isinstance(accuracy, list) or hasattr(accuracy, "lst"):  # newer polygraphy: one result per compare func
        accuracy = accuracy[0]
    iterations = accuracy[(model.name, reference.name)]
    rows = []
    for feed, outputs, got, expected in zip(
        feeds, iterations, results[model.name], results[reference.name], strict=True
    ):
        tokens = next(iter(feed.values())).shape[0]
        for name, result in outputs.items():
            want = np.asarray(expected[name], dtype=np.float32)
            finite = np.isfinite(want)
            scale = float(np.abs(want[finite]).max()) if finite.any() else 0.0
            nonfinite = int((~np.isfinite(np.asarray(got[name], dtype=np.float32))).sum())
            rows.append(
                Comparison(
                    output=name,
                    tokens=tokens,
                    max_abs=result.max_absdiff,
                    max_rel=result.max_reldiff,
                    mean_abs=result.mean_absdiff,
                    max_abs_scaled=_scaled(result.max_absdiff, scale),
                    # A NaN compares as nothing: an output holding one never passes.
                    passed=bool(result) and nonfinite == 0 and bool(finite.all()),
                    nonfinite=nonfinite,
                    reference_nonfinite=int((~finite).sum()),
                )
            )
    return rows


def nonfinite_summary(rows: Sequence[Comparison]) -> str | None:
    """One plain line when any output holds NaN or Inf, else None."""
    bad = [r for r in rows if r.nonfinite or r.reference_nonfinite]
    if not bad:
        return None
    worst = max(bad, key=lambda r: (r.nonfinite, r.reference_nonfinite))
    if worst.nonfinite and not worst.reference_nonfinite:
        return (
            f"the model's output is NaN/Inf in {worst.nonfinite} value(s) ({worst.output} at {worst.tokens} "
            "token(s)) where the reference's is finite: the model overflows or is broken, errors are meaningless"
        )
    return (
        f"{worst.output} at {worst.tokens} token(s): NaN/Inf in {worst.nonfinite} value(s) of the model's output "
        f"and {worst.reference_nonfinite} of the reference's"
    )


def _scaled(error: float, scale: float) -> float:
    if scale > 0:
        return error / scale
    return 0.0 if error == 0 else float("inf")


def _simple(**tolerances):
    """Polygraphy's elementwise atol/rtol check (SimpleCompareFunc since 0.50; CompareFunc.simple before)."""
    try:
        from polygraphy.comparator import SimpleCompareFunc
    except ImportError:
        from polygraphy.comparator import CompareFunc

        return CompareFunc.simple(**tolerances)
    return SimpleCompareFunc(**tolerances)


def comparison_table(rows: Sequence[Comparison], *, title: str) -> str:
    cells = [
        (
            r.output,
            r.tokens,
            f"{r.max_abs:.3e}",
            f"{r.max_rel:.3e}",
            f"{r.max_abs_scaled:.3e}",
            f"{r.mean_abs:.3e}",
            str(r.nonfinite),
            "ok" if r.passed else "FAIL",
        )
        for r in rows
    ]
    headers = (
        "output",
        "tokens",
        "max abs err",
        "max rel err",
        "max abs / max|ref|",
        "mean abs err",
        "NaN/Inf",
        "within tol",
    )
    return format_table(headers, cells, title=title)
