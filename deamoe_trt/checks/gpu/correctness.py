"""check-gpu's correctness rows: the kernels' routing (exact ids against the reference; any
difference must be a near-tie of the scores) and outputs (relative error against float32
math on the same weights, from the kernels' own routing)."""

from __future__ import annotations

import math
import traceback

import torch

from ...config import DeaMoEConfig
from ...layer import DeaMoELayer
from ...routing import department_scores, route_logits, router_logits, selection_scores
from ...runtimes.cuda import CudaRuntime
from ...runtimes.expected import TOLERANCE, float32_output, relative_error
from .cases import kind
from .report import Clock

NEAR_TIE = 1e-5  # score units: routing differences closer than this are float rounding


@torch.no_grad()
def decision_margin(config: DeaMoEConfig, logits: torch.Tensor, bias: torch.Tensor | None) -> float:
    """Smallest score gap that decides one token's routing (stage-1 order up to g+1, stage-2
    order up to k+1): a routing difference at a gap below NEAR_TIE is float rounding."""
    c = config
    _, selection = selection_scores(logits.float().cpu()[None], None if bias is None else bias.cpu(), c)
    dept = department_scores(selection, c)[0]
    per = selection[0].view(c.num_departments, c.experts_per_department)
    gaps = []
    ranked = dept.sort(descending=True).values[: c.top_departments + 1]
    gaps += (ranked[:-1] - ranked[1:]).tolist()
    kept = dept.sort(descending=True, stable=True).indices[: c.top_departments]
    candidates = per[kept].flatten().sort(descending=True).values[: c.top_k + 1]
    gaps += (candidates[:-1] - candidates[1:]).tolist()
    return min(gaps) if gaps else math.inf


@torch.no_grad()
def check_correctness(
    backend: CudaRuntime, layer: DeaMoELayer, preset: str, tokens: int, seed: int, clock: Clock
) -> dict:
    c, dtype = layer.config, layer.dtype
    gen = torch.Generator(device=backend.device).manual_seed(seed)
    x = torch.randn(tokens, c.hidden_size, generator=gen, device=backend.device).to(dtype)
    result: dict = {"preset": preset, "dtype": kind(layer), "tokens": tokens}
    try:
        got = backend.route(layer, x)
        ref = layer.route(x)
        logits = backend.router_logits(layer, x)
        torch_logits = router_logits(x, layer.router.weight, layer.router.logit_bias)
        # The decision logic alone: the reference's routing of the kernels' own logits.
        own = route_logits(logits, layer.router.bias, c)
        logic_exact = torch.equal(got.expert_ids, own.expert_ids) and torch.equal(
            got.kept_departments, own.kept_departments
        )
        rows = (got.expert_ids != ref.expert_ids).any(-1) | (got.kept_departments != ref.kept_departments).any(-1)
        mismatched = rows.nonzero().flatten().tolist()
        margins = [decision_margin(c, torch_logits[t], layer.router.bias) for t in mismatched]
        unexplained = [t for t, m in zip(mismatched, margins, strict=True) if m >= NEAR_TIE]
        weight_err = float((got.weights - own.weights).abs().max()) if tokens else 0.0
        result["routing"] = {
            "logic_exact": logic_exact,
            "tokens_differing_from_reference": len(mismatched),
            "differences_not_near_ties": len(unexplained),
            "max_logit_abs_error_vs_torch": float((logits - torch_logits).abs().max()),
            "max_weight_abs_error": weight_err,
        }
        y = backend.forward(layer, x)
        y2 = backend.forward(layer, x)
        want = float32_output(layer, x, got)
        err = relative_error(y, want)
        same_rows = ~rows
        native = layer(x).float()
        native_err = relative_error(y[same_rows], native[same_rows])
        result["output"] = {
            "relative_error_vs_fp32_math": err,
            "tolerance": TOLERANCE[dtype],
            "relative_error_vs_native_reference": native_err,
            "finite": bool(torch.isfinite(y).all()),
            "deterministic": bool(torch.equal(y, y2)),
            "shape_dtype_ok": y.shape == x.shape and y.dtype == dtype,
        }
        ok = (
            logic_exact
            and not unexplained
            and err < TOLERANCE[dtype]
            and result["output"]["finite"]
            and result["output"]["deterministic"]
            and result["output"]["shape_dtype_ok"]
        )
        result["pass"] = bool(ok)
    except Exception as exc:  # recorded, and the run goes on
        result["pass"] = False
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    status = "PASS" if result["pass"] else "FAIL"
    detail = result.get("error") or (
        f"rel.err {result['output']['relative_error_vs_fp32_math']:.2e} (tol {TOLERANCE[dtype]:.0e}), "
        f"routing diffs {result['routing']['tokens_differing_from_reference']} "
        f"(not near-ties: {result['routing']['differences_not_near_ties']}), "
        f"logic exact {result['routing']['logic_exact']}"
    )
    clock.log(f"  {status} {preset} {kind(layer)} T={tokens}: {detail}")
    return result
