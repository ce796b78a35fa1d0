"""Reading an export's metadata without loading its graph."""

from __future__ import annotations

import onnx
import pytest

from deamoe_trt.errors import UsageError
from deamoe_trt.trt.onnx_info import model_facts, read_metadata

from .conftest import export_model


def test_metadata_matches_onnx_load(tmp_path):
    path = export_model(tmp_path, dtype="bf16", max_tokens=128)
    meta = read_metadata(path)
    expected = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert {k: v for k, v in meta.items() if k != "__has_graph__"} == expected
    assert model_facts(path) == model_facts(path).__class__(form="plugin", dtype="bf16", max_tokens=128)


def test_external_data_model(tmp_path):
    from deamoe_trt import DeaMoELayer, get_preset
    from deamoe_trt.export import export

    path = export(DeaMoELayer.random(get_preset("tiny")), tmp_path / "m.onnx", "plugin", external_data_threshold=1)
    assert (tmp_path / "m.onnx.data").is_file()
    facts = model_facts(path)
    assert facts.form == "plugin" and facts.has_graph


def test_foreign_model_has_no_facts(tmp_path):
    model = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
    path = tmp_path / "other.onnx"
    onnx.save(model, str(path))
    facts = model_facts(path)
    assert not facts.is_export and facts.has_graph


def test_damaged_files(tmp_path):
    path = export_model(tmp_path)
    data = path.read_bytes()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) - 7])  # inside the last metadata entry
    with pytest.raises(UsageError):
        read_metadata(cut)
    text = tmp_path / "notes.onnx"
    text.write_text("[1, 2, 3]")
    with pytest.raises(UsageError):
        model_facts(text)
    with pytest.raises(UsageError, match="directory"):
        model_facts(tmp_path)
