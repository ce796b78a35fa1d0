"""Non-finite tokens through the kernels' routing and plan (deamoeRouting.cuh, deamoePlan.cuh
compiled for the host), against deamoe_trt.routing's rule: a token with a NaN or infinite
selection score goes to the lowest-index departments and experts, its weights are what the
math gives, and the other tokens of the tile route as if it were not there.

Run twice: in process, and in a child process under AddressSanitizer and UBSan, where any
out-of-bounds read or write (the INT_MAX ids this once produced) aborts the child.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import compile_shared

from deamoe_trt.checks.emulated import KERNEL_DIR
from deamoe_trt.config import DeaMoEConfig
from deamoe_trt.native import find_cxx
from deamoe_trt.routing import Routing, route_logits
from native.cuda.host_bindings import plan
from native.cuda.host_bindings import route_logits as host_route_logits

REPO = KERNEL_DIR.parents[1]

MODES = list(itertools.product(["softmax", "sigmoid"], ["max", "sum_top2", "sum"], [False, True]))
NAN, INF = float("nan"), float("inf")


def config(score_func: str, department_score: str, bias: bool) -> DeaMoEConfig:
    return DeaMoEConfig(
        hidden_size=8,
        num_departments=5,
        experts_per_department=4,
        shared_intermediate_size=8,
        private_intermediate_size=8,
        top_k=5,
        top_departments=3,
        score_func=score_func,
        department_score=department_score,
        router_bias=bias,
        routed_scaling_factor=2.5,
    )


def tile_logits(c: DeaMoEConfig, seed: int = 0) -> torch.Tensor:
    """16 tokens (one full tile): finite rows between rows holding NaN, +Inf and -Inf."""
    n = c.num_experts
    logits = torch.randn(16, n, generator=torch.Generator().manual_seed(seed))
    specials = {
        1: [(slice(None), NAN)],  # a NaN hidden state: every logit NaN
        3: [(7, NAN)],  # one NaN logit
        5: [(n - 1, INF)],  # one +Inf logit: NaN softmax, finite sigmoid
        7: [(0, -INF)],  # one -Inf logit: finite either way
        9: [(slice(None), -INF)],  # all -Inf: NaN softmax
        11: [(slice(None), INF)],  # all +Inf
        13: [(2, INF), (9, -INF)],
        15: [(4, NAN), (n - 2, INF)],
    }
    for token, edits in specials.items():
        for where, value in edits:
            logits[token, where] = value
    return logits


def selection_bias(c: DeaMoEConfig) -> torch.Tensor | None:
    return 0.05 * torch.randn(c.num_experts, generator=torch.Generator().manual_seed(1)) if c.router_bias else None


def host_results(lib) -> dict:
    """Routing then plan, chained as on the device, for every mode (JSON-able)."""
    out = {}
    for mode in MODES:
        c = config(*mode)
        r = host_route_logits(lib, c, tile_logits(c), selection_bias(c))
        p = plan(lib, c, r.expert_ids.numpy(), r.weights.numpy(), r.kept_departments.numpy())
        out["/".join(map(str, mode))] = {
            "expert_ids": r.expert_ids.tolist(),
            "weights": r.weights.tolist(),
            "kept_departments": r.kept_departments.tolist(),
            "plan": None if p is None else p.__dict__,
        }
    return out


def assert_matches_reference(results: dict) -> None:
    for mode in MODES:
        c = config(*mode)
        logits = tile_logits(c)
        ref = route_logits(logits, selection_bias(c), c)
        got = results["/".join(map(str, mode))]
        where = f"mode {mode}"
        assert got["kept_departments"] == ref.kept_departments.tolist(), where
        assert got["expert_ids"] == ref.expert_ids.tolist(), where
        torch.testing.assert_close(torch.tensor(got["weights"]), ref.weights, rtol=2e-6, atol=1e-7, equal_nan=True)
        check_plan(c, ref, torch.tensor(got["weights"]), got["plan"], where)
        # The rule itself, independently of route_logits: a non-finite token takes the
        # lowest-index departments and experts 0..k-1.
        bad = ~torch.isfinite(ref.scores + (0 if c.router_bias is False else selection_bias(c))).all(dim=-1)
        for t in bad.nonzero().squeeze(-1).tolist():
            assert got["kept_departments"][t] == list(range(c.top_departments)), where
            assert got["expert_ids"][t] == list(range(c.top_k)), where
        assert bad.any() and not bad.all()


def check_plan(c: DeaMoEConfig, r: Routing, host_weights: torch.Tensor, p: dict | None, where: str) -> None:
    """The plan lists the reference routing's parts and tokens, with the host routing's weights."""
    assert p is not None, where
    assert p["experts"] == r.used_experts().tolist(), where
    assert p["departments"] == r.used_departments().tolist(), where
    for e, entries in zip(p["experts"], p["expert_entries"], strict=True):
        tokens, slots = (r.expert_ids == e).nonzero(as_tuple=True)
        assert [(t, s) for t, s, _ in entries] == list(zip(tokens.tolist(), slots.tolist(), strict=True)), where
        torch.testing.assert_close(
            torch.tensor([w for _, _, w in entries]), host_weights[tokens, slots], rtol=0, atol=0, equal_nan=True
        )
    department_weights = Routing(
        r.expert_ids, host_weights, r.department_ids, r.kept_departments, r.scores
    ).department_weights(c.num_departments)
    for j, entries in zip(p["departments"], p["department_entries"], strict=True):
        tokens = (r.department_ids == j).any(dim=-1).nonzero().squeeze(-1)
        assert [t for t, _, _ in entries] == tokens.tolist(), where
        torch.testing.assert_close(
            torch.tensor([w for _, _, w in entries]), department_weights[tokens, j], rtol=1e-6, atol=0, equal_nan=True
        )


def test_nonfinite_tokens_route_like_the_reference(host_lib):
    assert_matches_reference(host_results(host_lib))


def test_finite_tokens_route_as_if_the_nonfinite_ones_were_absent(host_lib):
    for mode in MODES:
        c = config(*mode)
        logits, bias = tile_logits(c), selection_bias(c)
        finite = torch.isfinite(logits).all(dim=-1)
        alone = host_route_logits(host_lib, c, logits[finite], bias)
        together = host_route_logits(host_lib, c, logits, bias)
        assert torch.equal(together.expert_ids[finite], alone.expert_ids)
        assert torch.equal(together.weights[finite], alone.weights)


@pytest.mark.slow
def test_nonfinite_tokens_under_address_and_ub_sanitizers(tmp_path):
    """The same cases in a child process whose routing/plan library is built with
    -fsanitize=address,undefined: an out-of-bounds access or UB aborts it with a report."""
    cxx = find_cxx()
    if cxx is None:
        pytest.skip("no C++ compiler to build the sanitized host library")
    runtime = subprocess.run([cxx, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(runtime):
        pytest.skip(f"{cxx} has no AddressSanitizer runtime (libasan.so)")
    lib = tmp_path / "libdeamoe_host_sanitized.so"
    flags = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"]
    compile_shared(
        cxx,
        [
            "-std=c++17",
            "-O1",
            "-ffp-contract=off",
            *flags,
            f"-I{KERNEL_DIR}",
            str(Path(__file__).with_name("deamoeHostTest.cpp")),
        ],
        lib,
    )
    out = tmp_path / "results.json"
    child = (
        "import ctypes, json, sys; "
        "from native.cuda.test_host_nonfinite_routing import host_results; "
        "json.dump(host_results(ctypes.CDLL(sys.argv[1])), open(sys.argv[2], 'w'))"
    )
    env = dict(
        os.environ,
        LD_PRELOAD=runtime,  # the ASan runtime must be loaded before anything else
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]),
    )
    result = subprocess.run(
        [sys.executable, "-c", child, str(lib), str(out)], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"sanitized run failed:\n{result.stderr[-6000:]}"
    assert "runtime error" not in result.stderr, result.stderr[-6000:]
    assert_matches_reference(json.loads(Path(out).read_text()))
