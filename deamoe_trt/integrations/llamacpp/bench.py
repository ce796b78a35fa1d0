"""llama.cpp as a contender: its own tools run on GGUF files of the vanilla twin.

llama-bench times decoding (`-n` tokens after `-d` tokens of context, `-t` threads, one
repetition per call so that calls can be interleaved with other contenders), llama-quantize
makes the Q8_0 and Q4_0 files from the F16 one (llama.cpp's defaults for those types, so
what a llama.cpp user gets), and llama-perplexity scores held-out text. The binaries come
from scripts/build_llama_cpp.sh; llama-quantize and llama-perplexity are looked for beside
the llama-bench given.

Perplexity follows llama-perplexity's protocol, which `chunked_perplexity` repeats for a
PyTorch model: the tokens cut into chunks of n_ctx, each run from an empty cache, the
next-token loss counted over the second half of each chunk only. With `--kl-divergence-base
FILE` the tool also writes every counted position's log-probabilities (`read_logits`), which
is how the tests compare llama.cpp's outputs with the PyTorch reference token by token.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..._io import atomic_path
from ...errors import UsageError, one_line

GGUF_TYPES = ("f16", "Q8_0", "Q4_0")
# The llama.cpp file that stands beside a DeaMoE model of each weight precision.
MATCHING_TYPE = {None: "f16", 8: "Q8_0", 4: "Q4_0"}


@dataclass(frozen=True)
class LlamaTools:
    bench: Path
    quantize: Path
    perplexity: Path

    @classmethod
    def beside(cls, bench: str | Path) -> LlamaTools:
        """The tools next to the llama-bench binary at `bench`; a one-line UsageError naming
        the first one missing."""
        bench = Path(bench)
        if not bench.is_file():
            raise UsageError(f"--llama-bench {bench}: no such file (build it with scripts/build_llama_cpp.sh)")
        tools = cls(bench, bench.with_name("llama-quantize"), bench.with_name("llama-perplexity"))
        for path in (tools.bench, tools.quantize, tools.perplexity):
            if not path.is_file() or not path.stat().st_mode & 0o111:
                raise UsageError(f"{path} is missing or not executable (scripts/build_llama_cpp.sh builds it)")
        return tools


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise UsageError(f"cannot run {argv[0]}: {one_line(exc)}") from None
    if done.returncode != 0:
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        why = lines[-1].strip() if lines else "no output"
        raise UsageError(f"{Path(argv[0]).name} failed (exit {done.returncode}): {why}")
    return done


def quantize(tools: LlamaTools, source: Path, target: Path, kind: str, threads: int) -> Path:
    """llama-quantize source (an F16 GGUF) into target as kind (Q8_0, Q4_0), whole or not at all."""
    if kind not in GGUF_TYPES[1:]:
        raise UsageError(f"llama-quantize type must be one of {', '.join(GGUF_TYPES[1:])}, got {kind!r}")
    with atomic_path(target) as tmp:
        _run([str(tools.quantize), str(source), str(tmp), kind, str(threads)])
    return target


@dataclass(frozen=True)
class BenchSample:
    seconds_per_token: float
    build: str  # llama.cpp's commit and build number, as llama-bench reports them
    cpu: str


def bench(tools: LlamaTools, gguf: Path, *, tokens: int, depth: int, threads: int) -> BenchSample:
    """One llama-bench repetition: `tokens` decode steps after a `depth`-token prefill (untimed)."""
    argv = [str(tools.bench), "-m", str(gguf), "-p", "0", "-n", str(tokens), "-d", str(depth)]
    done = _run([*argv, "-t", str(threads), "-r", "1", "-o", "json"])
    try:
        (result,) = json.loads(done.stdout)
        (sample,) = result["samples_ns"]
    except (ValueError, KeyError) as exc:
        raise UsageError(f"llama-bench wrote no single JSON result: {one_line(exc)}") from None
    return BenchSample(
        sample * 1e-9 / result["n_gen"], f"{result['build_commit']} ({result['build_number']})", result["cpu_info"]
    )


BATCHED_TRIES = 3


@dataclass(frozen=True)
class BatchedSample:
    """One llama-batched-bench row: `sequences` sequences decoding together."""

    sequences: int
    seconds_per_step: float  # one token for every sequence
    tokens_per_s: float  # aggregate


def batched_bench(
    tools: LlamaTools, gguf: Path, *, sequences: tuple[int, ...], tokens: int, depth: int, threads: int
) -> list[BatchedSample]:
    """One llama-batched-bench run: for each count in sequences, that many sequences prefill
    `depth` tokens each (untimed here) then decode `tokens` steps together. Its rows go
    through llama.cpp's asynchronous logger, which can lose the last lines when the process
    exits (seen here: one row of two): a one-sequence run goes last as a spare, and a run
    that still misses a count is made again, up to BATCHED_TRIES times."""
    exe = tools.bench.with_name("llama-batched-bench")
    context = max(sequences) * (depth + tokens) + 16
    counts = ",".join(map(str, (*sequences, 1)))
    argv = [str(exe), "-m", str(gguf), "-c", str(context), "-b", "2048", "-ub", "512", "-npp", str(depth)]
    argv += ["-ntg", str(tokens), "-npl", counts, "-t", str(threads), "-tb", str(threads), "--output-format", "jsonl"]
    found: dict[int, BatchedSample] = {}
    for _ in range(BATCHED_TRIES):
        done = _run(argv)
        found = {}
        for line in (done.stdout + done.stderr).splitlines():
            line = line.strip()
            if not line.startswith("{") or '"speed_tg"' not in line:
                continue
            try:
                row = json.loads(line)
                sample = BatchedSample(int(row["pl"]), float(row["t_tg"]) / int(row["tg"]), float(row["speed_tg"]))
            except (ValueError, KeyError) as exc:
                raise UsageError(f"llama-batched-bench wrote a row this cannot read: {one_line(exc)}") from None
            found.setdefault(sample.sequences, sample)  # the first one-sequence row, not the spare
        if all(n in found for n in sequences):
            return [found[n] for n in sequences]
    raise UsageError(
        f"llama-batched-bench wrote rows for {len(found)} of {len(sequences)} sequence counts in {BATCHED_TRIES} runs"
    )


def perplexity(
    tools: LlamaTools, gguf: Path, text: Path, *, n_ctx: int, threads: int, chunks: int, logits: Path | None = None
) -> float:
    """llama-perplexity's perplexity on the first `chunks` chunks of n_ctx tokens of text (one
    sequence per batch), from the log-probabilities it writes (to `logits`, else a temporary
    file): its printed estimate goes through an asynchronous logger that can lose the last
    lines when the process exits, the file is written before it does. A target under the
    file's floor (16 nats below the top logit) counts at the floor."""
    with contextlib.ExitStack() as stack:
        if logits is None:
            logits = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="llama-ppl-"))) / "logits.bin"
        argv = [str(tools.perplexity), "-m", str(gguf), "-f", str(text), "-c", str(n_ctx), "-b", str(n_ctx)]
        _run([*argv, "-t", str(threads), "--chunks", str(chunks), "--kl-divergence-base", str(logits)])
        if not logits.is_file():
            raise UsageError(f"llama-perplexity wrote no log-probabilities for {gguf.name}")
        written = read_logits(logits)
    first = n_ctx // 2
    targets = written.tokens[:, first + 1 :]
    picked = np.take_along_axis(written.log_probs, targets[..., None].astype(np.int64), axis=-1)
    return math.exp(-float(picked.mean(dtype=np.float64)))


@dataclass(frozen=True)
class LlamaLogits:
    """What llama-perplexity --kl-divergence-base wrote: per chunk its token ids [n_ctx] and
    the log-probabilities [n_ctx - 1 - n_ctx // 2, vocab] at every counted position, stored
    as 16-bit steps above a floor 16 nats under the top logit (`floored` marks entries at
    or under the floor, whose value is only a bound)."""

    n_ctx: int
    tokens: np.ndarray  # [chunks, n_ctx] int32
    log_probs: np.ndarray  # [chunks, positions, vocab] float32
    floored: np.ndarray  # [chunks, positions, vocab] bool
    step: np.ndarray  # [chunks, positions] float32: the quantization step of each row


def read_logits(path: Path) -> LlamaLogits:
    data = path.read_bytes()
    if data[:8] != b"_logits_":
        raise UsageError(f"{path} is not a llama-perplexity logits file")
    n_ctx, vocab, chunks = np.frombuffer(data, np.int32, 3, 8)
    offset = 20
    tokens = np.frombuffer(data, np.int32, chunks * n_ctx, offset).reshape(chunks, n_ctx)
    offset += tokens.nbytes
    positions, width = n_ctx - 1 - n_ctx // 2, 2 * ((vocab + 1) // 2) + 4
    rows = np.frombuffer(data, np.uint16, chunks * positions * width, offset).reshape(chunks, positions, width)
    head = np.ascontiguousarray(rows[..., :4]).view(np.float32)  # [scale, floor] per row
    codes = rows[..., 4 : 4 + vocab].astype(np.float32)
    scale, floor = head[..., :1], head[..., 1:2]
    return LlamaLogits(int(n_ctx), tokens.copy(), floor + scale * codes, codes == 0, scale[..., 0])


@torch.no_grad()
def chunk_log_probs(model, ids: torch.Tensor, n_ctx: int, chunks: int) -> torch.Tensor:
    """llama-perplexity's counted positions for a PyTorch model: log-softmax [chunks,
    n_ctx - 1 - n_ctx // 2, vocab] of each chunk's logits at positions n_ctx // 2 .. n_ctx - 2,
    every chunk from an empty cache."""
    first = n_ctx // 2
    if ids.numel() < chunks * n_ctx:
        raise UsageError(f"{chunks} chunks of {n_ctx} tokens need {chunks * n_ctx} tokens, the text has {ids.numel()}")
    out = []
    for i in range(chunks):
        logits = model(ids[i * n_ctx : (i + 1) * n_ctx][None]).logits[0, first : n_ctx - 1]
        out.append(torch.log_softmax(logits.float(), dim=-1))
    return torch.stack(out)


def chunked_perplexity(model, ids: torch.Tensor, n_ctx: int, chunks: int) -> float:
    """exp(mean next-token loss) as llama-perplexity counts it (chunk_log_probs's positions)."""
    first = n_ctx // 2
    log_probs = chunk_log_probs(model, ids, n_ctx, chunks)
    targets = torch.stack([ids[i * n_ctx + first + 1 : (i + 1) * n_ctx] for i in range(chunks)])
    nll = -log_probs.gather(-1, targets[..., None]).mean().item()
    return math.exp(nll)


def bytes_per_token(gguf: Path, *, experts_read: float | None = None, tokens: int = 1) -> int:
    """Bytes of weights one decode step reads in a qwen3moe GGUF: every tensor, the experts'
    times expert_used_count / expert_count (a token reads that many experts of each block;
    experts_read: that fraction of them instead, a batch's union), one row of the token
    embedding per token (all of it when it is also the head)."""
    from gguf import GGUFReader

    reader = GGUFReader(gguf)
    arch = reader.fields["general.architecture"].contents()
    used = int(reader.fields[f"{arch}.expert_used_count"].contents())
    experts = int(reader.fields[f"{arch}.expert_count"].contents())
    fraction = used / experts if experts_read is None else experts_read
    names = {t.name for t in reader.tensors}
    total = 0.0
    for t in reader.tensors:
        if t.name.endswith("_exps.weight"):
            total += t.n_bytes * fraction
        elif t.name == "token_embd.weight" and "output.weight" in names:
            total += t.n_bytes / int(t.shape[-1]) * tokens  # ggml shape [d, vocab]: one of vocab rows
        else:
            total += t.n_bytes
    return round(total)


def gguf_type_summary(gguf: Path) -> dict[str, str]:
    """Tensor name -> ggml type name (what llama-quantize chose for each)."""
    from gguf import GGUFReader

    return {t.name: t.tensor_type.name for t in GGUFReader(gguf).tensors}
