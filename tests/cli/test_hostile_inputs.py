"""Every command against hostile input: one line on stderr, the expected exit code, no
traceback, no "internal error", and the inputs left as they were.

A row: the command line ({ckpt}: a layer checkpoint, {lm}: a language-model checkpoint,
{file}: a small text file, {tmp}: an empty folder, {long}: a name past 255 bytes, {deep}: a
checkpoint whose config.json nests 200,000 deep, {claims}: a one-layer checkpoint whose
config claims a billion layers, {lm_claims}: the same for a language model), the exit code
and a piece of the one line.
"""

from __future__ import annotations

import json
import shutil

import pytest

from deamoe_trt.cli.main import build_parser, main

ROWS = [
    ("demo", "-o {file}", 2, "it is a file, not a directory"),
    ("init", "--layers 1000000000 -o {tmp}/x", 2, "needs about"),
    ("init", "--seed 99999999999999999999999 -o {tmp}/x", 2, "expected a seed"),
    ("init", "-o {lm}", 2, "not a deamoe-trt layer checkpoint"),
    ("init", "-o {tmp}/{long}", 2, "longer than 255 bytes"),
    ("init", "-o /proc/x", 2, "takes no new files"),
    ("info", "{ckpt} --tokens 100000000", 2, "at most 65536"),
    ("info", "{deep}", 2, "nested too deeply"),
    ("info", "{claims}", 2, "num_layers is 1,000,000,000 but model.safetensors holds 1 layer(s); it lacks"),
    ("info", "{lm_claims}", 2, "num_layers is 1,000,000,000 but model.safetensors holds {lm_layers} layer(s)"),
    ("import-hf", "{file} -o {tmp}/x", 2, "is not a directory"),
    ("import-hf", "{tmp} -o /proc/x", 2, "takes no new files"),
    ("quantize", "{ckpt} -o {tmp}/q --bits 4 --group-size 16 --tokens 1000000000", 2, "expected a token count"),
    ("quantize", "{ckpt} -o {ckpt}/q --bits 4 --group-size 16", 2, "lies inside the input"),
    (
        "quantize",
        "{ckpt} -o {tmp}/q --bits 4 --group-size 16 --method awq --calibration random:100000000000",
        2,
        "random tokens of width 64 needs about",
    ),
    (
        "quantize",
        "{ckpt} -o {tmp}/q --bits 4 --group-size 16 --method awq --calibration /dev/null",
        2,
        "/dev/null is not a regular file",
    ),
    ("export", "{ckpt} -o {ckpt}/model.safetensors --form onnx", 2, "lies inside the input"),
    ("export", "{ckpt} -o {tmp}/{long}.onnx --form onnx", 2, "longer than 255 bytes"),
    ("validate", "{file} --against {ckpt} --tokens 100000000", 2, "at most 65536"),
    ("validate", "{file} --against {ckpt} --inputs {file}", 2, "it is not a .npy file"),
    ("bench", "--quick --json /proc/x", 2, "takes no new files"),
    ("bench", "--quick --threads 5000", 2, "expected a thread count"),
    ("bench-lm", "--max-memory-gb nan", 2, "expected a number of GB > 0"),
    ("bench-lm", "--max-memory-gb -1", 2, "expected a number of GB > 0"),
    ("build", "{file} -o {tmp}/e.engine --device-memory nan", 2, "expected a number of GB > 0"),
    ("build", "{file} -o {tmp}/e.engine --device-memory inf", 2, "expected a number of GB > 0"),
    ("doctor", "--plugin {tmp}/missing.so", 1, "missing pieces"),
    ("check-gpu", "--out /proc/x --dry-run", 2, "takes no new files"),
    ("check-gpu", "--library {file} --dry-run --out {tmp}/o", 2, "is not a shared library"),
    ("check-trt", "/proc/x", 2, "takes no new files"),
    ("check-edgellm", "/proc/x --hf-dir {tmp}", 2, "takes no new files"),
    ("train", "-o /proc/x --preset micro", 2, "takes no new files"),
    ("train", "-o {tmp}/t --preset micro --threads 5000", 2, "expected"),
    ("train-tiny", "-o /proc/x --quick", 2, "takes no new files"),
    ("train-tiny", "-o {ckpt} --quick", 2, "not a deamoe-trt language-model checkpoint"),
    ("generate", "{lm} --prompt a --threads 5000", 2, "expected a thread count"),
    ("generate", "{lm} --prompt a --threads 20000", 2, "expected a thread count"),
    ("generate", "{lm} --prompt a --seed -1", 2, "expected a seed"),
    ("generate", "{lm} --prompt a --temperature nan", 2, "expected a number >= 0"),
    ("generate", "{lm_claims} --prompt a", 2, "num_layers is 1,000,000,000"),
    ("export-lm", "{lm} -o {lm}/model.safetensors --form onnx", 2, "lies inside the input"),
    ("export-lm", "{lm} -o {tmp}/{long}.onnx --form onnx", 2, "longer than 255 bytes"),
    (
        "convert",
        "{ckpt} -o {tmp}/c --departments 2 --top-departments 1 --shared-size 4 --report /proc/x/r.json",
        2,
        "takes no new files",
    ),
    ("convert", "{ckpt} -o {ckpt} --departments 2 --top-departments 1 --shared-size 4", 2, "is the input"),
    ("convert", "{ckpt} -o {tmp}/c --departments 2 --top-departments 1 --shared-size 4 --heal-lr nan", 2, "> 0"),
    ("triton-repo", "-o {tmp}/r --lm {lm} --ort {file} --lm-name x --ort-name x", 2, "are both 'x'"),
    ("triton-repo", "-o /proc/x --lm {lm}", 2, "takes no new files"),
    ("triton-repo", "-o {tmp}/r --lm {lm} --threads 5000", 2, "expected a thread count"),
    ("serve-bench", "{lm} --clients 0", 2, "expected an integer >= 1"),
    ("export-edgellm", "{lm} -o /proc/x", 2, "takes no new files"),
    ("export-edgellm", "{lm} -o {lm}/e", 2, "lies inside the input"),
    ("export-vllm", "{lm} -o {lm}", 2, "is the input"),
    ("export-vllm", "{lm} -o {ckpt}", 2, "not a deamoe-trt vLLM model directory"),
    ("export-hf", "{tmp}/missing -o {tmp}/hf", 2, "no model checkpoint"),
]


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    from configs import MICRO_LM
    from deamoe_trt import DeaMoEStack
    from deamoe_trt.lm import DeaMoELM
    from deamoe_trt.presets import get_preset

    root = tmp_path_factory.mktemp("hostile")
    ckpt = DeaMoEStack.random(get_preset("tiny"), 1, seed=0).save_pretrained(root / "ckpt")
    lm = DeaMoELM.random(MICRO_LM, seed=3).save_pretrained(root / "lm")
    (root / "file.txt").write_text("not a model\n")
    deep = shutil.copytree(ckpt, root / "deep")
    (deep / "config.json").write_text("[" * 200_000 + "]" * 200_000)
    places = {"ckpt": ckpt, "lm": lm, "file": root / "file.txt", "deep": deep, "long": "n" * 300}
    places["lm_layers"] = MICRO_LM.num_layers
    for name, source, where in (("claims", ckpt, None), ("lm_claims", lm, "config")):
        copy = shutil.copytree(source, root / name)
        header = json.loads((copy / "config.json").read_text())
        (header[where] if where else header)["num_layers"] = 1_000_000_000
        (copy / "config.json").write_text(json.dumps(header))
        places[name] = copy
    return places


def _snapshot(places) -> dict[str, bytes]:
    return {
        str(p): p.read_bytes()
        for name in ("ckpt", "lm", "deep", "claims", "lm_claims")
        if isinstance(places[name], type(places["ckpt"]))
        for p in sorted(places[name].rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize(("command", "rest", "code", "message"), ROWS, ids=[f"{r[0]} {r[1]}"[:60] for r in ROWS])
def test_hostile_input_is_one_line_and_the_expected_exit_code(places, tmp_path, capsys, command, rest, code, message):
    before = _snapshot(places)
    argv = [command, *(part.format(tmp=tmp_path, **places) for part in rest.split())]
    try:
        got = main(argv)
    except SystemExit as exc:  # argparse's own refusals
        got = exc.code
    out, err = capsys.readouterr()
    err = err.strip().splitlines()
    message = message.format(**places)
    assert got == code, err
    assert "internal error" not in "\n".join(err) and "Traceback" not in "\n".join(err)
    if code == 2:
        assert len(err) == 1 and message in err[0], err
    else:
        assert message in out, out  # a diagnosis that ran: its report says what is missing
    assert _snapshot(places) == before  # no input was touched


def test_the_table_covers_every_command():
    import argparse

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(commands) - {row[0] for row in ROWS} == set()
