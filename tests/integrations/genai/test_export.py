"""ONNX Runtime GenAI model folders: GenAI's own batched greedy search against deamoe-trt's
ONNX Runtime decoder on the same model.onnx, its tokenizer against the byte tokenizer, and
the refusals (plugin form, dtypes, versions) that leave nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from deamoe_trt.cli.main import main
from deamoe_trt.errors import UsageError
from deamoe_trt.export.lm import build_lm_model
from deamoe_trt.integrations.genai import export as genai
from deamoe_trt.lm.checkpoint import load_lm
from deamoe_trt.lm.shipped import TINY_LM
from deamoe_trt.lm.tokenizer import PRINTABLE_ASCII
from deamoe_trt.quant import QuantConfig
from deamoe_trt.quantize.lm import quantize_lm
from deamoe_trt.runtimes.decode import generate
from deamoe_trt.runtimes.onnxruntime import OrtDecoder

# Different lengths, so GenAI pads the batch and the graph's attention_mask must hide the padding.
PROMPTS = ("It was a truth ", "Anne", "The Musgroves had ")
NEW_TOKENS = 24


def cli(capsys, *argv):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.fixture(scope="module")
def tiny_lm():
    return load_lm(TINY_LM)


def og_or_skip():
    return pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed (the test extra has it)")


def genai_greedy(folder: Path, prompt_ids: list[list[int]], new_tokens: int, pad_id: int) -> list[list[int]]:
    """GenAI's greedy search over all prompts in one batch (right-padded with pad_id, as its
    tokenizer's encode_batch pads): each sequence's new ids."""
    og = og_or_skip()
    model = genai.load_genai(folder)
    longest = max(len(ids) for ids in prompt_ids)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=longest + new_tokens, batch_size=len(prompt_ids))
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray([ids + [pad_id] * (longest - len(ids)) for ids in prompt_ids], np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return [[int(t) for t in generator.get_sequence(i)][longest:] for i in range(len(prompt_ids))]


def ort_greedy(model, prompt_ids: list[list[int]], new_tokens: int, **export) -> list[list[int]]:
    """`deamoe-trt generate --runtime ort`'s decoding of the same model, one prompt at a time."""
    decoder = OrtDecoder.from_model(model, threads=1, **export)
    return [generate(decoder, ids, new_tokens).new_ids for ids in prompt_ids]


def test_byte_level_tokenizer_json_encodes_and_decodes_like_the_byte_tokenizer(tiny_lm):
    from tokenizers import Tokenizer

    hf = Tokenizer.from_str(json.dumps(genai.byte_level_tokenizer_json(tiny_lm.tokenizer)))
    text = PRINTABLE_ASCII + "  two  spaces\n\nand a blank line "
    ids = hf.encode(text, add_special_tokens=False).ids
    assert ids == tiny_lm.tokenizer.encode(text)
    assert hf.decode(ids) == text
    assert hf.get_vocab_size() == 256


def test_genai_tokenizer_reads_the_folder_and_gives_the_byte_ids(tiny_lm, tmp_path):
    og = og_or_skip()
    folder = genai.export_genai(tiny_lm.model, tmp_path / "genai", tokenizer=tiny_lm.tokenizer)
    tokenizer = og.Tokenizer(genai.load_genai(folder))
    text = PRINTABLE_ASCII + " end"
    ids = [int(i) for i in tokenizer.encode(text)]
    assert ids == tiny_lm.tokenizer.encode(text)
    assert tokenizer.decode(np.asarray(ids, dtype=np.int32)) == text


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_genai_batched_greedy_equals_ort_generate(tiny_lm, tmp_path, capsys, dtype):
    og_or_skip()
    code, err = cli(capsys, "export-lm", TINY_LM, "-o", tmp_path / "genai", "--target", "genai", "--dtype", dtype)
    assert code == 0, err
    prompt_ids = [tiny_lm.tokenizer.encode(p) for p in PROMPTS]
    expected = ort_greedy(tiny_lm.model, prompt_ids, NEW_TOKENS, dtype=dtype)
    assert len({tuple(e) for e in expected}) == len(PROMPTS)  # distinct continuations: no row mixed up
    assert genai_greedy(tmp_path / "genai", prompt_ids, NEW_TOKENS, genai.BYTE_EOS) == expected


@pytest.mark.parametrize("linears", [(), ("attention",)], ids=["ffn", "ffn+attention"])
def test_genai_batched_greedy_equals_ort_generate_int4_ort_form(tiny_lm, tmp_path, linears):
    og_or_skip()
    quantized = quantize_lm(tiny_lm.model, QuantConfig(bits=4, group_size=32), linears=linears)
    folder = genai.export_genai(quantized, tmp_path / "genai4", "ort", tokenizer=tiny_lm.tokenizer)
    ops = {node.op_type for node in onnx.load(folder / genai.MODEL_FILE).graph.node}
    assert "QMoE" in ops  # the int4 weights run as ONNX Runtime's quantized MoE inside GenAI
    assert ("DequantizeLinear" in ops) == bool(linears)  # quantized projections: blocked DequantizeLinear
    prompt_ids = [tiny_lm.tokenizer.encode(p) for p in PROMPTS]
    expected = ort_greedy(quantized, prompt_ids, NEW_TOKENS, form="ort")
    assert genai_greedy(folder, prompt_ids, NEW_TOKENS, genai.BYTE_EOS) == expected


def test_a_second_export_replaces_the_folder_contents_atomically(tiny_lm, tmp_path):
    folder = tmp_path / "genai"
    genai.export_genai(tiny_lm.model, folder, tokenizer=tiny_lm.tokenizer)
    first = (folder / genai.MODEL_FILE).read_bytes()
    genai.export_genai(tiny_lm.model, folder, "onnx", tokenizer=tiny_lm.tokenizer)
    assert (folder / genai.MODEL_FILE).read_bytes() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["genai"]  # no staging folder left


def test_an_export_over_an_earlier_one_leaves_no_file_of_it(tmp_path, capsys):
    # An earlier export of a model with a Hugging Face tokenizer left its special_tokens_map.json,
    # which GenAI's tokenizer would read beside this model's byte-level tokenizer.json.
    export = ("export-lm", TINY_LM, "--target", "genai", "--form", "onnx", "-o")
    assert cli(capsys, "export-lm", TINY_LM, "--target", "genai", "-o", tmp_path / "genai")[0] == 0
    (tmp_path / "genai" / "special_tokens_map.json").write_text('{"eos_token": "</s>"}')
    code, err = cli(capsys, *export, tmp_path / "genai")
    assert code == 0 and len(err) == 1 and "replaced" in err[0], err
    assert cli(capsys, *export, tmp_path / "fresh")[0] == 0
    names = sorted(p.name for p in (tmp_path / "genai").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "fresh").iterdir())
    for name in names:
        assert (tmp_path / "genai" / name).read_bytes() == (tmp_path / "fresh" / name).read_bytes(), name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "genai"]  # no temporary left


def test_a_folder_not_written_by_an_export_is_replaced_only_with_force(tmp_path, capsys):
    (tmp_path / "genai").mkdir()
    (tmp_path / "genai" / "notes.txt").write_text("mine")
    code, err = cli(capsys, "export-lm", TINY_LM, "--target", "genai", "-o", tmp_path / "genai")
    assert code == 2 and len(err) == 1 and "--force" in err[0], err
    assert [p.name for p in (tmp_path / "genai").iterdir()] == ["notes.txt"]
    assert cli(capsys, "export-lm", TINY_LM, "--target", "genai", "--force", "-o", tmp_path / "genai")[0] == 0
    assert not (tmp_path / "genai" / "notes.txt").exists() and genai.is_genai_folder(tmp_path / "genai")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--form", "plugin"), "writes the ort or onnx form, not 'plugin'"),
        (("--dtype", "bf16"), "not bf16"),
        (("--validate",), "--validate checks a single ONNX file"),
        (("--external-data-threshold", "0"), "places a single ONNX file's weights"),
    ],
)
def test_export_refuses_what_genai_cannot_run_in_one_line_writing_nothing(tmp_path, capsys, flags, message):
    code, err = cli(capsys, "export-lm", TINY_LM, "-o", tmp_path / "genai", "--target", "genai", *flags)
    assert code == 2
    assert len(err) == 1 and message in err[0]
    assert list(tmp_path.iterdir()) == []


def test_a_failed_export_leaves_no_folder(tiny_lm, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(genai, "save_model", broken)
    with pytest.raises(UsageError, match="disk full"):
        genai.export_genai(tiny_lm.model, tmp_path / "genai", tokenizer=tiny_lm.tokenizer)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("version", ["0.17.2", "0.19.0", "1.0.0", "dev"])
def test_genai_versions_outside_the_tested_range_are_refused_in_one_line(version):
    with pytest.raises(UsageError) as caught:
        genai.check_genai_version(version)
    assert "\n" not in str(caught.value) and version in str(caught.value)


def test_the_tested_version_is_accepted():
    genai.check_genai_version("0.18.0")


def test_loading_with_an_untested_installed_genai_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    og = og_or_skip()
    monkeypatch.setattr(og, "__version__", "0.99.0")
    with pytest.raises(UsageError, match=r"0\.99\.0 is outside"):
        genai.load_genai(tmp_path / "no-such-folder")


@pytest.mark.slow
def test_genai_batched_greedy_equals_ort_generate_on_an_imported_qwen3_moe(tmp_path):
    """The imported family with the most options (q/k norms, a dense layer, YaRN, a sliding
    window) and a Hugging Face tokenizer's eos/bos ids in the config. Ids, not text: the test
    model's WordLevel tokenizer is one GenAI's tokenizer does not read."""
    og_or_skip()
    pytest.importorskip("transformers")
    from importers.hf_lm_models import build_hf_model, prompt_ids

    from deamoe_trt.importers.hf_lm import import_hf_lm

    build_hf_model("qwen3_moe", tmp_path / "hf")
    import_hf_lm(tmp_path / "hf", tmp_path / "lm")
    loaded = load_lm(tmp_path / "lm")
    folder = genai.export_genai(loaded.model, tmp_path / "genai", tokenizer=loaded.tokenizer)
    config = json.loads((folder / genai.CONFIG_FILE).read_text())["model"]
    assert (config["eos_token_id"], config["bos_token_id"]) == tuple(loaded.tokenizer.encode("</s> <s>"))
    # Equal lengths: without a pad token the config pads with eos, an id the random model may emit.
    prompts = [prompt_ids(7, seed) for seed in (1, 2)]
    assert genai_greedy(folder, prompts, NEW_TOKENS, config["pad_token_id"]) == ort_greedy(
        loaded.model, prompts, NEW_TOKENS
    )


def test_padded_rows_give_the_logits_of_the_unpadded_prompt_in_prefill_and_decode(tiny_lm):
    """The graph alone (no GenAI): a right-padded row whose padding attention_mask hides and
    whose positions position_ids gives decodes as that prompt alone does."""
    import onnxruntime as ort

    proto = build_lm_model(tiny_lm.model, "ort", tokenizer=tiny_lm.tokenizer)
    genai.add_padding_inputs(proto)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    c = tiny_lm.model.config
    long, short = tiny_lm.tokenizer.encode("It was a truth "), tiny_lm.tokenizer.encode("Anne")
    pad = len(long) - len(short)
    names = [o.name for o in session.get_outputs()]
    empty = np.zeros((2, c.num_key_value_heads, 0, c.head_dim), np.float32)
    feeds = {name.replace("present", "past_key_values"): empty for name in names[1:]}
    feeds |= {
        "input_ids": np.asarray([long, short + [0] * pad], np.int64),
        "attention_mask": np.asarray([[1] * len(long), [1] * len(short) + [0] * pad], np.int64),
        "position_ids": np.asarray([range(len(long)), list(range(len(short))) + [0] * pad], np.int64),
    }
    logits, *cache = session.run(names, feeds)
    step = {n.replace("present", "past_key_values"): v for n, v in zip(names[1:], cache, strict=True)}
    step |= {
        "input_ids": np.asarray([[32], [32]], np.int64),
        "attention_mask": np.asarray([[1] * (len(long) + 1), [1] * len(short) + [0] * pad + [1]], np.int64),
        "position_ids": np.asarray([[len(long)], [len(short)]], np.int64),
    }
    next_logits = session.run(names[:1], step)[0]

    alone = OrtDecoder.from_model(tiny_lm.model, threads=1)
    expected, expected_cache = alone.run(np.asarray([short]), alone.empty_cache())
    expected_next, _ = alone.run(np.asarray([[32]]), expected_cache)
    np.testing.assert_allclose(logits[1, : len(short)], expected[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(next_logits[1, 0], expected_next[0, 0], rtol=1e-5, atol=1e-5)


def test_export_target_genai_names_this_writer():
    import pkgutil

    from deamoe_trt.export.run import FOLDER_TARGETS

    assert pkgutil.resolve_name(FOLDER_TARGETS["genai"]) is genai.export_genai
