"""serve-bench's inputs: the shipped prompts by default, a prompts file otherwise, bad files refused
before any server starts (the load and fault run itself is tests/integrations/triton/test_server.py)."""

import pytest

from deamoe_trt.cli.main import main
from deamoe_trt.errors import UsageError
from deamoe_trt.integrations.triton import bench as serve_load
from deamoe_trt.lm.checkpoint import read_lm_header
from deamoe_trt.lm.shipped import PROMPTS_FILE, TINY_LM, read_prompts


def test_default_prompts_are_the_shipped_file_and_the_tiny_lm_can_encode_them():
    lines = [line for line in PROMPTS_FILE.read_text(encoding="utf-8").split("\n") if line]
    assert list(serve_load.PROMPTS) == lines
    assert len(set(map(len, lines))) > 1  # different lengths, so caches differ in length
    tokenizer = read_lm_header(TINY_LM)["tokenizer"]
    for prompt in serve_load.PROMPTS:
        assert tokenizer.decode(tokenizer.encode(prompt)) == prompt


def test_a_prompts_file_gives_its_non_empty_lines(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("first prompt\n\n  \nsecond\n", encoding="utf-8")
    assert read_prompts(path) == ["first prompt", "second"]


@pytest.mark.parametrize("content", [None, "", "\n  \n"])
def test_serve_bench_refuses_a_missing_or_empty_prompts_file(tmp_path, capsys, content):
    path = tmp_path / "prompts.txt"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(UsageError):
        read_prompts(path)
    code = main(["serve-bench", str(TINY_LM), "--prompts", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and str(path) in err[0]
