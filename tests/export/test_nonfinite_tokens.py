"""Tokens holding NaN or +-Inf through the routing graph and the three forms on ONNX Runtime,
against the reference's rule (deamoe_trt.routing: a token with non-finite selection scores
routes to the lowest-index departments and experts, its output is what the math gives)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deamoe_trt import route
from deamoe_trt.export import build_model
from deamoe_trt.validation import make_session

from .conftest import CONFIGS, feed, layer_of
from .test_routing_graph import _routing_session

BAD = {"nan": float("nan"), "+inf": float("inf"), "-inf": -float("inf")}
GOOD_TOKENS = [0, 2, 4, 5]


def tokens_with(config, bad: float) -> torch.Tensor:
    """6 tokens: 1 has one bad value, 3 is bad throughout, the others are finite."""
    x = torch.randn(6, config.hidden_size, generator=torch.Generator().manual_seed(3))
    x[1, 5] = bad
    x[3] = bad
    return x


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_routing_graph_routes_nonfinite_tokens_like_the_reference(config_name, bad):
    layer = layer_of(CONFIGS[config_name], seed=4)
    x = tokens_with(layer.config, BAD[bad])
    ids, weights, _ = _routing_session(layer).run(None, {"x": x.numpy()})
    with torch.no_grad():
        expected = route(x, layer.router.weight, layer.router.bias, layer.config)
    np.testing.assert_array_equal(ids, expected.expert_ids.numpy())
    np.testing.assert_allclose(weights, expected.weights.numpy(), rtol=1e-6, atol=1e-7, equal_nan=True)


def assert_nonfinite_tokens_kept_to_themselves(session, layer) -> None:
    """For NaN, +Inf and -Inf tokens: the session's output is non-finite exactly where the
    reference's math is, token by token, and every other token gets the reference's output
    and the same as without the bad tokens (not bitwise: ONNX Runtime's kernels block their
    sums by batch size)."""
    (alone,) = session.run(None, {"hidden_states": feed(tokens_with(layer.config, 0.0)[GOOD_TOKENS])})
    for bad in BAD.values():
        x = tokens_with(layer.config, bad)
        (y,) = session.run(None, {"hidden_states": feed(x)})
        with torch.no_grad():
            reference = layer.forward_routed(x, layer.route(x)).numpy()
        np.testing.assert_array_equal(np.isfinite(y).all(axis=1), np.isfinite(reference).all(axis=1))
        assert not np.isfinite(y[3]).all()
        np.testing.assert_allclose(y[GOOD_TOKENS], reference[GOOD_TOKENS], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(y[GOOD_TOKENS], alone, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("form", ["plugin", "ort", "onnx"])
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_forms_keep_nonfinite_tokens_to_themselves(form, config_name):
    layer = layer_of(CONFIGS[config_name], seed=5)
    assert_nonfinite_tokens_kept_to_themselves(make_session(build_model(layer, form)), layer)


def test_ort_vanilla_anchor_passes_nonfinite_tokens_on():
    """The ort form of a plain top-k MoE routes with com.microsoft.MoE, which outputs 0 for a
    token whose router values are NaN; the form passes the token's non-finite state on."""
    layer = layer_of(CONFIGS["tiny"].vanilla(), seed=6)
    assert_nonfinite_tokens_kept_to_themselves(make_session(build_model(layer, "ort")), layer)
