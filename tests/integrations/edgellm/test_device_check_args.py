"""`deamoe-trt check-edgellm`: a bad argument is one line naming the flag, exit 2, and nothing
is written (no Edge-LLM needed, unlike test_device_check.py)."""

import pytest
from cli_status import cli_main


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--tokens", "x"], "--tokens"),
        (["--tokens", "2"], "--tokens must be at least 4"),
        (["--max-kv-cache", "0"], "--max-kv-cache"),
        (["--hf-dir", "nowhere"], "has no config.json"),
    ],
)
def test_bad_values_are_one_line_naming_the_flag_and_exit_2(tmp_path, capsys, monkeypatch, argv, named):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    out = tmp_path / "out"
    assert cli_main(["check-edgellm", str(out), "--hf-dir", "hf", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err and "internal error" not in err
    assert not out.exists()
