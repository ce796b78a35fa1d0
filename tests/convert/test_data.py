"""`convert --data`: text, JSONL and parquet read to the same tokens, a budget, a held-out
split kept apart and reported, and bad data refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from deamoe_trt.cli.main import main as cli
from deamoe_trt.convert.data import read_tokens
from deamoe_trt.lm import ByteTokenizer, DeaMoELM

from .test_convert_lm import TEXT, VANILLA

DOCUMENTS = [TEXT[i : i + 2500] for i in range(0, 20000, 2500)]
WINDOW = 33


def expected_ids(docs: list[str]) -> list[int]:
    return ByteTokenizer().encode("\n\n".join(docs))


def write_jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path


def write_parquet(path: Path, docs: list[str]) -> Path:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": docs, "id": list(range(len(docs)))}), path, row_group_size=3)
    return path


def test_jsonl_parquet_and_text_read_to_the_same_tokens(tmp_path):
    text = tmp_path / "a.txt"
    text.write_text("\n\n".join(DOCUMENTS))
    reads = [
        read_tokens(p, ByteTokenizer(), window=WINDOW)
        for p in (text, write_jsonl(tmp_path / "a.jsonl", DOCUMENTS), write_parquet(tmp_path / "a.parquet", DOCUMENTS))
    ]
    for data in reads:
        assert data.ids.tolist() == expected_ids(DOCUMENTS)
    assert reads[1].summary["documents"] == reads[2].summary["documents"] == len(DOCUMENTS)


def test_the_budget_and_the_held_out_split(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", DOCUMENTS)
    data = read_tokens(path, ByteTokenizer(), budget=5000, heldout_fraction=0.2, window=WINDOW)
    assert data.ids.tolist() == expected_ids(DOCUMENTS)[:5000]
    assert data.summary["calibration_tokens"] == [0, 4000] and data.summary["heldout_tokens"] == [4000, 5000]
    assert data.summary["documents"] == 2  # reading stops once the budget is met


def test_a_folder_reads_its_files_in_name_order(tmp_path):
    write_jsonl(tmp_path / "b.jsonl", DOCUMENTS[4:])
    write_parquet(tmp_path / "a.parquet", DOCUMENTS[:4])
    (tmp_path / "notes.md").write_text("not data")
    assert read_tokens(tmp_path, ByteTokenizer(), window=WINDOW).ids.tolist() == expected_ids(DOCUMENTS)


@pytest.fixture
def source_lm(tmp_path):
    return DeaMoELM.random(VANILLA, seed=5).save_pretrained(tmp_path / "src")


def convert(src, out, *extra) -> int:
    argv = ["convert", str(src), "-o", str(out), "--departments", "2", "--shared-fraction", "0.5"]
    return cli([*argv, "--top-departments", "1", "--no-compare", *extra])


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_convert_reports_the_data_and_its_disjoint_held_out_split(source_lm, tmp_path, kind):
    write = write_jsonl if kind == "jsonl" else write_parquet
    path = write(tmp_path / f"data.{kind}", DOCUMENTS)
    report = tmp_path / "r.json"
    assert (
        convert(source_lm, tmp_path / "out", "--data", str(path), "--data-tokens", "12000", "--report", str(report))
        == 0
    )
    data = json.loads(report.read_text())["data"]
    assert data["tokens"] == 12000 and data["format"] == [kind]
    assert data["calibration_tokens"] == [0, 10800] and data["heldout_tokens"] == [10800, 12000]
    held = json.loads(report.read_text())["source"]["heldout_tokens"]
    assert held > 0


def test_healing_windows_from_data_cover_the_calibration_part_only(tmp_path):
    from deamoe_trt.convert.sources import lm_source

    data = read_tokens(write_jsonl(tmp_path / "a.jsonl", DOCUMENTS), ByteTokenizer(), window=WINDOW)
    lm = DeaMoELM.random(VANILLA, seed=5).eval()
    source = lm_source(lm, ByteTokenizer(), data.ids, seq_len=32, heal_on_all=True)
    start = data.heldout_start
    assert source.heal_windows.shape == (start // WINDOW, WINDOW)
    assert torch.equal(source.heal_windows.reshape(-1), data.ids[: source.heal_windows.numel()])
    assert source.heal_windows.numel() <= start  # no held-out token heals


@pytest.mark.parametrize(
    ("content", "name", "message"),
    [
        (b"", "empty.jsonl", "is empty"),
        (b"\xff\xfe not utf-8", "bad.txt", "is not UTF-8"),
        (b'{"text": "Anne"}\n{"text": "Elliot"}\n', "short.jsonl", "has too few tokens: 12"),
        (b'{"text": "Anne"}\nnot json\n', "broken.jsonl", "line 2 is not JSON"),
        (b'{"body": "Anne"}\n', "field.jsonl", 'line 1 has no "text" string'),
        (b'{"text": "   "}\n', "blank.jsonl", "has no text"),
    ],
)
def test_bad_data_is_refused_in_one_line_and_nothing_is_written(source_lm, tmp_path, capsys, content, name, message):
    path = tmp_path / name
    path.write_bytes(content)
    assert convert(source_lm, tmp_path / "out", "--data", str(path)) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_too_few_tokens_for_the_requested_split_is_refused(source_lm, tmp_path, capsys):
    path = write_jsonl(tmp_path / "a.jsonl", DOCUMENTS)
    # 20000 tokens, but 0.2% held out is fewer than one window of 48 (the model's context)
    assert convert(source_lm, tmp_path / "out", "--data", str(path), "--heldout-fraction", "0.002") == 2
    err = capsys.readouterr().err.strip()
    assert "too few tokens: 20014" in err and "held-out fraction of 0.002 with windows of 48" in err
    assert "\n" not in err
