"""llama.cpp as a bench-lm contender: its tools found and refused clearly, perplexity counted
as llama-perplexity counts it, and (with the binaries) its rows beside ours in one run."""

from __future__ import annotations

import math

import pytest
import torch

from deamoe_trt.cli.main import main
from deamoe_trt.errors import UsageError
from deamoe_trt.integrations.llamacpp.bench import LlamaTools, chunked_perplexity


def test_bench_lm_refuses_a_missing_llama_bench_in_one_line(capsys, tmp_path):
    assert main(["bench-lm", "--llama-bench", str(tmp_path / "llama-bench")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no such file (build it with scripts/build_llama_cpp.sh)" in err and "\n" not in err


def test_llama_bench_without_llama_quantize_beside_it_is_refused(tmp_path):
    bench = tmp_path / "llama-bench"
    bench.write_text("#!/bin/sh\n")
    bench.chmod(0o755)
    with pytest.raises(UsageError, match=r"llama-quantize is missing or not executable"):
        LlamaTools.beside(bench)


class _Uniform(torch.nn.Module):
    """Equal logits everywhere: every next token has probability 1 / vocab."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab

    def forward(self, ids):
        return type("Out", (), {"logits": torch.zeros(*ids.shape, self.vocab)})()


def test_chunked_perplexity_of_a_uniform_model_is_its_vocabulary():
    ids = torch.randint(0, 50, (100,))
    assert chunked_perplexity(_Uniform(50), ids, 16, 6) == pytest.approx(50, rel=1e-6)
    with pytest.raises(UsageError, match="7 chunks of 16 tokens need 112 tokens, the text has 100"):
        chunked_perplexity(_Uniform(50), ids, 16, 7)


def test_bench_lm_names_this_integrations_modules():
    from deamoe_trt.bench import lm_bench
    from deamoe_trt.integrations.llamacpp import bench, export

    assert lm_bench._llama_cpp() is bench and lm_bench._llama_cpp("export") is export


@pytest.mark.slow
def test_bench_lm_times_llama_cpp_beside_our_runtimes():
    from llama_cpp_tools import llama_tools

    from deamoe_trt.bench.lm_bench import lm_bench_table, run_lm_bench

    tools = llama_tools()
    result = run_lm_bench(
        layers=1, departments=2, steps=2, prompt=4, threads=1, runtimes=("cpu",), progress=None,
        llama_bench=tools.bench, llama_tokens=4,
    )  # fmt: skip
    llama = {r["gguf_type"]: r for r in result["rows"] if r["runtime"] == "llama.cpp"}
    ours = {r["twin"]: r for r in result["rows"] if r["runtime"] == "cpu"}
    assert set(llama) == {"f16", "Q8_0", "Q4_0"}
    assert all(len(r["step_ms"]) == 2 for r in llama.values())  # one llama-bench call per round
    assert llama["f16"]["bytes_per_token"] > llama["Q8_0"]["bytes_per_token"] > llama["Q4_0"]["bytes_per_token"]
    # The same vanilla twin, scored by llama-perplexity on its F16 file and by PyTorch in fp16.
    assert llama["f16"]["perplexity"] == pytest.approx(ours["vanilla"]["perplexity"], rel=1e-2)
    assert all(math.isfinite(r["perplexity"]) for r in llama.values())
    assert ours["deamoe"]["vs_llama"] == pytest.approx(llama["f16"]["tpot_ms"] / ours["deamoe"]["tpot_ms"])
    table = lm_bench_table(result)
    assert "vanilla twin, llama.cpp Q4_0" in table and "vs llama.cpp f16" in table


@pytest.mark.slow
def test_batched_bench_times_llama_batched_bench_at_the_same_counts():
    from llama_cpp_tools import llama_tools

    from deamoe_trt.bench.lm_bench import lm_batch_table, run_lm_batch_bench

    tools = llama_tools()
    if not tools.bench.with_name("llama-batched-bench").is_file():
        pytest.skip("llama-batched-bench absent: rerun scripts/build_llama_cpp.sh")
    result = run_lm_batch_bench(
        layers=1, departments=2, steps=2, prompt=4, threads=1, progress=None, sequences=(1, 2),
        llama_bench=tools.bench, llama_tokens=4, twins=("deamoe", "vanilla"),
    )  # fmt: skip
    llama = {r["sequences"]: r for r in result["rows"] if r["runtime"] == "llama-batched-bench"}
    ours = {(r["twin"], r["sequences"]): r for r in result["rows"] if r["runtime"] == "cpu-native"}
    assert set(llama) == {1, 2} and all(r["gguf_type"] == "f16" for r in llama.values())
    assert all(len(r["step_ms"]) == 2 for r in llama.values())  # one call per round, every count in it
    # Two sequences read at least one's experts; a token's share is top_k / N of them.
    assert llama[2]["bytes_per_step"] >= llama[1]["bytes_per_step"]
    for n in (1, 2):
        mine = ours["deamoe", n]
        assert mine["vs_llama"] == pytest.approx(llama[n]["tpot_ms"] / mine["tpot_ms"])
        assert llama[n]["tokens_per_s"] == pytest.approx(n / llama[n]["tpot_ms"] * 1e3)
    assert "vs llama.cpp f16" in lm_batch_table(result)


def fake_llama_batched_bench(tmp_path, rows: list[str]) -> LlamaTools:
    """llama.cpp's tools as scripts; llama-batched-bench records its arguments and prints rows."""
    for name in ("llama-bench", "llama-quantize", "llama-perplexity"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    script = tmp_path / "llama-batched-bench"
    body = "".join(f"echo '{row}'\n" for row in rows)
    script.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "argv"}\necho "log line"\n{body}')
    script.chmod(0o755)
    return LlamaTools.beside(tmp_path / "llama-bench")


def test_batched_bench_reads_one_row_per_count_of_sequences(tmp_path):
    from deamoe_trt.integrations.llamacpp.bench import batched_bench

    row = '{{"pp": 4, "tg": 8, "pl": {pl}, "n_kv": 48, "t_tg": {t}, "speed_tg": {speed}}}'
    tools = fake_llama_batched_bench(
        tmp_path, [row.format(pl=1, t=0.4, speed=20.0), row.format(pl=4, t=0.8, speed=40.0)]
    )
    samples = batched_bench(tools, tmp_path / "m.gguf", sequences=(1, 4), tokens=8, depth=4, threads=2)
    assert [(s.sequences, s.seconds_per_step, s.tokens_per_s) for s in samples] == [(1, 0.05, 20.0), (4, 0.1, 40.0)]
    argv = (tmp_path / "argv").read_text().split()
    assert argv[argv.index("-npl") + 1] == "1,4,1" and argv[argv.index("-ntg") + 1] == "8"  # a spare run last
    assert argv[argv.index("-npp") + 1] == "4" and int(argv[argv.index("-c") + 1]) >= 4 * (4 + 8)
    missing = fake_llama_batched_bench(tmp_path, [row.format(pl=1, t=0.4, speed=20.0)])
    with pytest.raises(UsageError, match="wrote rows for 1 of 2 sequence counts in 3 runs"):
        batched_bench(missing, tmp_path / "m.gguf", sequences=(1, 4), tokens=8, depth=4, threads=2)
