"""Target profiles and their rules: which GPU each accepts, token bounds, profile shapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from deamoe_trt.errors import UsageError
from deamoe_trt.trt import targets as tg

from .conftest import A40, AGX_ORIN, H100, H200, ORIN_NANO, RTX_4090, THOR, THOR_CUDA12


@pytest.mark.parametrize("profile", list(tg.TARGETS.values()), ids=list(tg.TARGETS))
def test_profiles_are_consistent(profile):
    assert profile.precision in ("fp32", "fp16", "bf16")
    assert profile.compute_capabilities
    assert 0 <= profile.optimization_level <= 5
    assert profile.workspace_bytes >= 64 * tg.MiB
    assert 1 <= profile.opt_tokens <= profile.default_max_tokens <= profile.max_tokens_limit
    assert profile.min_tensorrt >= (10, 3)
    assert profile.description


def test_choices_are_the_documented_ones():
    assert tg.TARGET_CHOICES == ("a40", "orin", "orin-nano", "thor", "h100", "h200", "auto")


@pytest.mark.parametrize(
    ("gpu", "name"),
    [
        (A40, "a40"),
        (AGX_ORIN, "orin"),
        (ORIN_NANO, "orin-nano"),
        (H100, "h100"),
        (H200, "h200"),
        (THOR, "thor"),
        (THOR_CUDA12, "thor"),
    ],
)
def test_auto_picks_by_compute_capability_and_memory(gpu, name):
    assert tg.resolve_target("auto", gpu).name == name
    assert tg.resolve_target(name, gpu).name == name


def test_auto_refuses_an_unknown_architecture():
    with pytest.raises(UsageError, match=r"no build target for NVIDIA GeForce RTX 4090 \(compute capability 8.9\)"):
        tg.resolve_target("auto", RTX_4090)


def test_a_named_target_must_match_the_gpu():
    with pytest.raises(UsageError) as info:
        tg.resolve_target("orin", A40)
    message = str(info.value)
    assert "compute capability 8.7" in message and "NVIDIA A40 with 8.6" in message
    assert "not portable" in message and "--target a40" in message
    with pytest.raises(UsageError, match="h100"):
        tg.resolve_target("h100", AGX_ORIN)
    with pytest.raises(UsageError, match=r"RTX 4090 with 8\.9") as info:
        tg.resolve_target("a40", RTX_4090)
    assert "auto for this GPU" not in str(info.value)  # no profile fits it: no hint


def test_same_architecture_targets_are_interchangeable():
    # Memory only steers auto; an Orin NX 8 GB owner may still choose orin, an H200 owner h100.
    assert tg.resolve_target("orin", ORIN_NANO).name == "orin"
    assert tg.resolve_target("orin-nano", AGX_ORIN).name == "orin-nano"
    assert tg.resolve_target("h100", H200).name == "h100"


def test_unknown_target():
    with pytest.raises(UsageError, match="unknown target 'xavier'; choose one of: a40, orin"):
        tg.get_target("xavier")


def test_max_tokens_bounds():
    nano = tg.get_target("orin-nano")
    assert tg.check_max_tokens(nano, None) == nano.default_max_tokens
    assert tg.check_max_tokens(nano, nano.max_tokens_limit) == nano.max_tokens_limit
    with pytest.raises(UsageError, match="above the orin-nano target's limit of 256"):
        tg.check_max_tokens(nano, nano.max_tokens_limit + 1)
    for bad in (0, -3, True, 2.5):
        with pytest.raises(UsageError, match="integer >= 1"):
            tg.check_max_tokens(nano, bad)


def test_token_range_is_decode_sized():
    a40 = tg.get_target("a40")
    assert tg.token_range(a40, 64) == (1, 4, 64)
    assert tg.token_range(a40, 2) == (1, 2, 2)
    assert tg.token_range(tg.get_target("orin"), 64) == (1, 1, 64)


def test_profile_shapes():
    shapes = tg.profile_shapes([("hidden_states", (-1, 2048)), ("static", (4, 4))], (1, 4, 64))
    assert shapes == {"hidden_states": ((1, 2048), (4, 2048), (64, 2048))}
    assert tg.profile_shapes([("x", (8, 16))], (1, 1, 1)) == {}
    with pytest.raises(UsageError, match="only its first \\(token\\) dimension may be dynamic"):
        tg.profile_shapes([("hidden_states", (-1, -1))], (1, 4, 64))
    with pytest.raises(UsageError, match="'x'"):
        tg.profile_shapes([("x", (8, -1))], (1, 4, 64))


def test_default_timing_cache_is_per_target_arch_and_version(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = tg.default_timing_cache(tg.get_target("orin"), AGX_ORIN, (10, 3))
    assert path == Path(tmp_path) / "deamoe-trt" / "timing" / "orin-sm_87-trt10.3.cache"


def test_gpu_info_text():
    assert THOR.sm == "sm_110" and THOR.cc == "11.0"
