"""The per-GPU kernel variant tables (deamoe_trt.cuda.tuning): file names, selection by layer
shape, dtype, bits and token tile, the fallback to the default, and refusals of bad files."""

from __future__ import annotations

import json

import pytest

from deamoe_trt.cuda import tuning
from deamoe_trt.errors import UsageError
from deamoe_trt.presets import PRESETS

DEEPSEEK = PRESETS["deepseek-v3-layer"]
QWEN = PRESETS["qwen3-30b-a3b-layer"]


def entry(config, dtype: str, bits: int, tokens: int, variant: str) -> dict:
    return {"shape": tuning.shape_key(config), "dtype": dtype, "bits": bits, "tokens": tokens, "variant": variant,
            "median_us": {"default": 2.0, variant: 1.0}}  # fmt: skip


@pytest.fixture
def tables(tmp_path):
    entries = [entry(DEEPSEEK, "bf16", 4, 1, "staged-down"), entry(DEEPSEEK, "bf16", 4, 16, "default")]
    tuning.write_table(tmp_path / "NVIDIA_H200.json", "NVIDIA H200", entries, {"date": "2026-12-06"})
    yield str(tmp_path)
    tuning.load_table.cache_clear()


def test_a_device_name_becomes_one_file_name():
    assert tuning.device_file_name("NVIDIA H200") == "NVIDIA_H200.json"
    assert tuning.device_file_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3.json"
    assert tuning.device_file_name("Orin (nvgpu)") == "Orin_nvgpu.json"
    with pytest.raises(UsageError, match="no table name"):
        tuning.device_file_name(" -- ")


def test_token_counts_map_to_the_kernels_tiles():
    assert [tuning.tile_tokens(n) for n in (0, 1, 2, 3, 5, 8, 9, 16, 40)] == [1, 1, 2, 4, 8, 8, 16, 16, 16]


def test_the_table_picks_the_listed_variant_of_the_case(tables):
    assert tuning.select("NVIDIA H200", DEEPSEEK, "bf16", 4, 1, tables) == "staged-down"
    assert tuning.select("NVIDIA H200", DEEPSEEK, "bf16", 4, 16, tables) == "default"
    assert tuning.select("NVIDIA H200", DEEPSEEK, "bf16", 4, 9, tables) == "default"  # tile 16


def test_an_unlisted_token_tile_takes_the_nearest_listed_one(tables):
    assert tuning.select("NVIDIA H200", DEEPSEEK, "bf16", 4, 2, tables) == "staged-down"
    assert tuning.select("NVIDIA H200", DEEPSEEK, "bf16", 4, 8, tables) == "default"
    # tile 4 is as far from 1 as from 16 (in powers of two): the smaller wins
    assert tuning.select("NVIDIA H200", DEEPSEEK, "bf16", 4, 4, tables) == "staged-down"


def test_an_unlisted_case_or_gpu_gets_the_default(tables):
    assert tuning.select("NVIDIA H200", DEEPSEEK, "bf16", 8, 1, tables) == "default"  # other bits
    assert tuning.select("NVIDIA H200", DEEPSEEK, "fp16", 4, 1, tables) == "default"  # other dtype
    assert tuning.select("NVIDIA H200", QWEN, "bf16", 4, 1, tables) == "default"  # other shape
    assert tuning.select("NVIDIA A40", DEEPSEEK, "bf16", 4, 1, tables) == "default"  # no table
    assert tuning.select(None, DEEPSEEK, "bf16", 4, 1, tables) == "default"  # no GPU


def test_shapes_differ_in_every_size_the_speed_depends_on():
    base = tuning.shape_key(QWEN)
    for change in (
        dict(hidden_size=1024),
        dict(num_departments=8, experts_per_department=16),
        dict(shared_intermediate_size=256),
        dict(private_intermediate_size=512),
        dict(top_k=4),
    ):
        assert tuning.shape_key(QWEN.replace(**change)) != base, change


def test_the_fastest_variant_must_beat_the_default_by_the_margin():
    assert tuning.fastest({"default": 100.0, "staged-down": 90.0}) == "staged-down"
    assert tuning.fastest({"default": 100.0, "staged-down": 99.0}) == "default"  # within 2%
    assert tuning.fastest({"default": 100.0, "staged-down": 120.0}) == "default"
    assert tuning.fastest({"staged-down": 3.0, "other": 2.0}) == "other"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[]", 'an object with a "device" name'),
        ('{"device": "X"}', 'an "entries" list'),
        ('{"device": "X", "entries": [{"shape": "s"}]}', "entry 0 needs shape, dtype, bits, tokens and variant"),
        (
            '{"device": "X", "entries": [{"shape": "s", "dtype": "bf16", "bits": 4, "tokens": 3, "variant": "v"}]}',
            "tokens must be one of",
        ),
        ("{not json", "not readable JSON"),
    ],
)
def test_a_malformed_table_is_refused_in_one_line(tmp_path, text, problem):
    (tmp_path / "Broken_GPU.json").write_text(text)
    try:
        with pytest.raises(UsageError, match=r"kernel variant table .*Broken_GPU\.json") as raised:
            tuning.load_table("Broken GPU", str(tmp_path))
        assert problem in str(raised.value) and "\n" not in str(raised.value)
    finally:
        tuning.load_table.cache_clear()


def test_a_written_table_reads_back_with_its_stamp(tables):
    data = json.loads((tuning.Path(tables) / "NVIDIA_H200.json").read_text())
    assert data["device"] == "NVIDIA H200" and data["measured"] == {"date": "2026-12-06"}
    table = tuning.load_table("NVIDIA H200", tables)
    assert table is not None and table.measured == {"date": "2026-12-06"}


def test_every_shipped_table_parses():
    for path in sorted(tuning.TABLE_DIR.glob("*.json")):
        table = tuning.parse_table(json.loads(path.read_text()), str(path))
        assert tuning.device_file_name(table.device) == path.name


def test_a_variant_name_is_its_parts_joined():
    assert tuning.variant_parts("default") == frozenset()
    assert tuning.variant_parts("staged-deep+bit-dequant") == {"staged-down", "deep-loads", "bit-dequant"}


def test_the_tuner_times_only_variants_that_change_kernels_for_the_format():
    names = ["default", "staged-down", "deep-loads", "staged-deep", "bit-dequant", "staged-down+bit-dequant"]
    assert tuning.distinct_variants(names, 0) == ["default", "staged-down", "deep-loads", "staged-deep"]
    assert tuning.distinct_variants(names, 4) == ["default", "staged-down", "bit-dequant", "staged-down+bit-dequant"]
