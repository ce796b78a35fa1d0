"""runtimes/text_generation.py: the `generate` workflow, called as the command calls it."""

import pytest
import torch

from deamoe_trt import runtimes
from deamoe_trt.lm import load_lm
from deamoe_trt.lm.model import TWINS
from deamoe_trt.runtimes.decode import generate
from deamoe_trt.runtimes.text_generation import generate_text


def test_each_twin_prints_its_text_and_the_tpot_table(micro_checkpoint, capsys):
    assert generate_text(str(micro_checkpoint), prompts=["Anne"], max_new_tokens=12, twins=TWINS) == 0
    out = capsys.readouterr().out
    assert sum(line.startswith("--- ") for line in out.splitlines()) == 3 and "(same tokens as deamoe)" in out
    assert "TPOT ms" in out and "tokens/s" in out and "vanilla" in out


def test_ort_prints_the_text_torch_prints(micro_checkpoint, capsys):
    assert generate_text(str(micro_checkpoint), prompts=["Anne"], max_new_tokens=10) == 0
    torch_text = capsys.readouterr().out.split("\n")[1]
    assert generate_text(str(micro_checkpoint), prompts=["Anne"], max_new_tokens=10, runtime="ort") == 0
    out = capsys.readouterr().out
    assert out.split("\n")[1] == torch_text
    assert "\nort " in out


def test_sampling_with_a_seed_is_reproducible(micro_checkpoint, capsys):
    options = {"prompts": ["A"], "max_new_tokens": 20, "temperature": 1.0, "top_k": 8, "seed": 3}
    generate_text(str(micro_checkpoint), **options)
    first = capsys.readouterr().out.split("\n")[1]
    generate_text(str(micro_checkpoint), **options)
    assert capsys.readouterr().out.split("\n")[1] == first


def test_torch_threads_are_restored_after_a_run(micro_checkpoint, capsys):
    before = torch.get_num_threads()
    other = 2 if before == 1 else 1
    generate_text(str(micro_checkpoint), prompts=["A"], max_new_tokens=2, threads=other)
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("runtime", ["torch", "cpu"])
def test_several_prompts_decode_together_as_each_alone(micro_checkpoint, tmp_path, capsys, runtime):
    if runtimes.get(runtime).available() is not None:
        pytest.skip(runtimes.get(runtime).available())
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("The cat\n\nOnce\n", encoding="utf-8")
    code = generate_text(
        str(micro_checkpoint),
        prompts=["Anne", "B"],
        prompts_file=str(prompts_file),
        max_new_tokens=8,
        max_sequences=2,
        runtime=runtime,
    )
    assert code == 0
    out = capsys.readouterr().out
    loaded = load_lm(micro_checkpoint)
    for i, prompt in enumerate(["Anne", "B", "The cat", "Once"]):
        ids = loaded.tokenizer.encode(prompt)
        alone = generate(runtimes.get(runtime).decoder(loaded.model, threads=1), ids, 8).new_ids
        assert f"[{i}] {prompt}{loaded.tokenizer.decode(alone)}\n" in out
    assert "4 sequences, at most 2 at once" in out and "tokens/s aggregate" in out
