"""Whole-model time per output token: a DeaMoE language model against its expanded and vanilla
twins, on deamoe-trt's CPU kernel and on ONNX Runtime, decode steps interleaved.

The model: `--layers` blocks (default 2) of Qwen3-30B-A3B's attention (d=2048, 32 query /
4 KV heads of 128, per-head q/k RMSNorm) with DeaMoE FFNs of qwen3-30b-a3b-layer's shapes
(experts of width 768 = 384 shared in the department + 384 private, top-8 experts from the
top-2 departments), with `--departments` departments of 8 experts (default 4; 16 in the
preset: fewer keep the three twins' ONNX Runtime sessions, which hold about four times
their fp16 weights, inside 8 GiB, without changing the bytes a token reads), an 8k
vocabulary (so that the LM head's share of a step's bytes is about what it is in the
48-layer Qwen3-30B-A3B, 15%, not what it would be on top of 2 blocks), fp16 weights,
random (seeded).

Method: every contender prefills the same random prompt; then `--steps` decode steps each,
each feeding its own greedy token (the deamoe and expanded twins compute the same function,
so they decode the same tokens), in bursts of BURST consecutive steps that take turns across
the contenders, so machine drift reaches all of them alike; TPOT is the median step, the
first step of each burst (after another contender's) counted apart. Contenders of one runtime are
built, interleaved and freed before the next runtime's, so memory holds one runtime's
twins at a time; ratios are taken within a runtime. Bytes per token: the FFN weights each
step's routing reads (deamoe_trt.traffic, from the hidden states the CPU contenders saw)
plus every other weight a step reads (attention, norms, router, LM head, one embedding
row; in float32 on the cpu runtime, which runs that part in float32, see deamoe_trt.runtimes.cpu_kernel;
in fp16 on cpu-native, the whole step in native code, deamoe_trt.cpu.model_step).
The roof: the CPU kernel's streaming read bandwidth, measured before and after and once per
burst between the contenders' steps (a shared VM's bandwidth drifts by a third within a
minute; the median of measurements spread over the run is the roof the steps saw).

`--attention mla`: the blocks have DeepSeek-V2-Lite's multi-head latent attention instead
(16 heads, latent cache of 512 + 64 values per token; deamoe_trt.lm.mla), same FFNs.

`--quantized 4|8`: the same model with every DeaMoE FFN (and so every twin's) quantized,
round to nearest, fp16 scales (deamoe_trt.quantize.lm); the ort runtime runs
com.microsoft.QMoE, the CPU kernel its quantized path, and the FFN bytes are the packed
codes plus scales each step's routing reads.

`--llama-bench PATH` (a llama-bench binary; deamoe_trt.integrations.llamacpp.bench): llama.cpp joins as a
contender on the vanilla twin, written as a GGUF qwen3moe file at F16 (deamoe_trt.integrations.llamacpp.export)
and quantized by llama-quantize to Q8_0 and Q4_0 (from the floating-point twin, whatever
--quantized says). Inside every runtime's step loop, at its start and half way, each file gets
one llama-bench call of `llama_tokens` decode steps after a prompt-long context, so llama.cpp
is timed on the machine as our contenders find it; its TPOT is the median over those calls.
Its bytes per token are its GGUF's tensors (experts times top_k / N, one embedding row). Every
model's quality is printed beside: perplexity on the held-out part of the shipped text by
llama-perplexity's protocol (chunks of PPL_CONTEXT tokens, the second half of each counted),
llama-perplexity itself for the GGUF files, the PyTorch reference for ours.

`run_lm_batch_bench` (`--sequences 1,4,16`): batched decoding on one runtime's batch
decoder (BATCH_RUNTIMES: cpu-native, the native step; cuda, the whole model on a GPU,
runtimes.cuda_decoder; cuda-emulated, the same under the SIMT emulator). Every twin at each
count of sequences is a contender (its own prompts, the same for every twin), stepped in the
same interleaved bursts; TPOT is a batched step, tokens/s the sequences over it, bytes per
step the union the batch's routing reads (replayed as above). The roof is measured in the
same run, as the device's memory is read: the CPU kernel's streaming read on cpu-native, a
device-to-device copy (read + write) on cuda; on cuda-emulated it is not measured (the
kernels run on the CPU, one host thread per CUDA thread). With `--llama-bench` (cpu-native),
llama.cpp's llama-batched-bench decodes the vanilla twin's GGUF (f16 and the type matching
--quantized) at the same counts, called between the bursts.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import runtimes as registry
from ..config import DeaMoEConfig
from ..console import format_bytes, format_table
from ..errors import UsageError
from ..lm.config import LMConfig
from ..lm.model import TWINS
from ..presets import get_preset
from ..quant import QuantConfig
from ..runtimes.base import BatchDecoder, Decoder
from ..runtimes.cpu_kernel import CpuDecoder
from ..traffic import BYTES_PER_WEIGHT, weights_loaded


def _one_sequence_runtimes() -> tuple[str, ...]:
    """Every runtime that decodes on the CPU at speed (not the reference, not emulated), and
    each of its modes apart: ("cpu", "cpu-native", "ort"). cpu: attention in PyTorch (float32),
    FFNs on the kernel; cpu-native: the whole step in native code."""
    names = []
    for name in registry.names(can="decoding", gpu=False, reference=False, emulated=False):
        names += [name] + [f"{name}-{mode}" for mode in registry.get(name).capabilities.modes]
    return tuple(names)


RUNTIMES = _one_sequence_runtimes()
LLAMA = "llama.cpp"
# llama.cpp's tools and GGUF writer are its integration's; named here rather than imported (a
# stage imports no integration) and loaded only when --llama-bench runs it.
LLAMA_CPP = "deamoe_trt.integrations.llamacpp"
PPL_CONTEXT = 128  # tokens per llama-perplexity chunk (the evaluation length of train-tiny)
PPL_CHUNKS = 4
LLAMA_ROUNDS = 2  # llama-bench calls per GGUF file and runtime phase
# Consecutive steps of one contender before the next takes over. A decoder's steps follow each
# other, as in generation and in llama-bench's timed run; the first step of a burst, taken
# just after another contender's, pays the switch (the other's threads still spinning, its own
# waking up) and is reported apart.
BURST = 8
ROOF_PROBE_BYTES = 1 << 28  # per burst: well past the caches, a few tens of milliseconds


ATTENTIONS = ("gqa", "mla")
# DeepSeek-V2-Lite's multi-head latent attention (d = 2048 as Qwen3-30B-A3B's): 16 heads, no
# q LoRA, kv_lora_rank 512, 128 nope + 64 rotary query/key dims, 128 value dims.
V2_LITE_MLA = dict(
    num_heads=16,
    num_key_value_heads=16,
    head_dim=0,
    qk_norm="none",
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    attention_multiplier=192**-0.5,
)


def bench_config(layers: int = 2, departments: int = 4, vocab: int = 8192, context: int = 512, attention: str = "gqa"):
    if attention not in ATTENTIONS:
        raise UsageError(f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
    layer = get_preset("qwen3-30b-a3b-layer")
    moe = DeaMoEConfig.from_dict({**layer.to_dict(), "num_departments": departments})
    config = LMConfig(
        vocab_size=vocab,
        hidden_size=layer.hidden_size,
        num_layers=layers,
        num_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        qk_norm="head",
        max_position_embeddings=context,
        rope_theta=1e6,
        moe=moe,
    )
    return config.replace(**V2_LITE_MLA) if attention == "mla" else config


@dataclass
class Contender:
    twin: str
    runtime: str
    decoder: Decoder
    token: int = 0
    step_s: list[float] = field(default_factory=list)  # steps that followed one of its own
    switch_s: list[float] = field(default_factory=list)  # the first step of each burst
    hidden: list[list[torch.Tensor]] = field(default_factory=list)  # per step, per MoE block: its FFN input
    layers: dict = field(default_factory=dict)  # CPU kernel: block -> its packed FFN
    sink: list = field(default_factory=list)  # CPU kernel: each FFN call's input, in order
    untimed: int = 0  # the token of the untimed step after the prefill
    fed: list[int] = field(default_factory=list)  # the tokens of the timed steps, in order


class _Recording:
    """A CPU FFN that keeps a copy of its input (one row per token: microseconds) for the traffic count."""

    def __init__(self, ffn, sink: list):
        self.ffn, self.sink = ffn, sink

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.sink.append(x.detach().clone())
        return self.ffn(x)


def _contender(base, twin: str, runtime: str, threads: int) -> Contender:
    """The twin of base on runtime (deamoe_trt.runtimes). On the CPU kernel the twin's FFNs are
    packed one block at a time onto base's attention, and each records its inputs for the
    traffic count (cpu-native runs the same FFNs in native code: its FFN bytes are counted by
    replaying its tokens on the recording path, _replayed_ffn_bytes); on ONNX Runtime the
    twin's fp16 export runs with its weights in memory and threads that do not spin (they
    would steal a core from the next contender)."""
    from .. import runtimes

    if runtime == "ort":
        return Contender(
            twin, runtime, runtimes.get(runtime).decoder(base, threads=threads, twin=twin, dtype="fp16", spinning=False)
        )
    if runtime == "cpu-native":
        return Contender(twin, runtime, runtimes.get("cpu").decoder(base, threads=threads, twin=twin, step="native"))
    decoder = runtimes.get(runtime).decoder(base, threads=threads, twin=twin, step="torch")
    assert isinstance(decoder, CpuDecoder)  # the decoder whose packed FFNs can be swapped for recording ones
    contender = Contender(twin, runtime, decoder, layers=decoder.ffns)
    decoder.ffns = {i: _Recording(ffn, contender.sink) for i, ffn in decoder.ffns.items()}
    return contender


def memory_estimate(config, runtime: str) -> int:
    """Bytes a runtime's phase holds: the base model, plus every twin's FFNs packed for the
    kernel (cpu), or held by ONNX Runtime (ort: the fp16 arrays and, measured on 1.32 with
    com.microsoft.MoE, about three times as much again for its own copies: 7.7 GiB peak for
    the default 2 blocks of 4 departments, whose three twins' FFNs are 1.55 GB)."""
    ffn_bytes = _ffn_bytes
    moe_blocks = config.num_layers - len(config.dense_layers)
    twins = sum(ffn_bytes(m) for m in (config.moe, config.moe.expanded(), config.moe.vanilla())) * moe_blocks
    base = ffn_bytes(config.moe) * moe_blocks + _other_bytes(config, 2)
    if runtime in ("cpu", "cpu-native"):
        return base + twins
    # While a twin's session is made, its PyTorch model and ONNX proto exist too.
    return base + 4 * twins + 2 * ffn_bytes(config.moe.vanilla()) * moe_blocks


def _ffn_bytes(moe) -> int:
    """One fp16 DeaMoE layer of config moe, in bytes."""
    from ..layer import DeaMoELayer

    layer = DeaMoELayer(moe, dtype=torch.float16, device="meta")
    return sum(t.numel() * 2 for t in layer.state_dict().values())


def _other_bytes(config, bytes_per_weight: int) -> float:
    """Bytes a step reads outside the DeaMoE FFNs (per token): attention, norms, head, an
    embedding row; the projections of config.quantized_linears as stored (codes and fp16 scales)."""
    from ..lm.model import Block

    d, b, q = config.hidden_size, bytes_per_weight, config.quantization

    def matrix(weights: int, quantized: bool) -> float:
        if not quantized:
            return weights * b
        assert q is not None  # LMConfig checks
        return weights * q.bits / 8 + weights / q.group_size * BYTES_PER_WEIGHT[torch.float16]

    block = Block(config, 0, device="meta")  # attention and norms: every weight outside the FFN
    quantized = "attention" in config.quantized_linears
    attention = sum(
        matrix(p.numel(), quantized and p.dim() == 2)
        for name, p in block.named_parameters()
        if not name.startswith("mlp.")
    )
    head = matrix(config.vocab_size * d, "head" in config.quantized_linears)
    return config.num_layers * attention + (d + d) * b + head


def _quantized(config: LMConfig, quant: QuantConfig | None, linears: tuple[str, ...]) -> LMConfig:
    """config with --quantized's FFNs and --linears' projections."""
    if linears and quant is None:
        raise UsageError("--linears needs --quantized (the projections take its bits and group size)")
    return config.replace(quantization=quant, quantized_linears=tuple(linears))


def _llama_cpp(part: str = "bench") -> Any:
    """The llama.cpp integration's module part: "bench" (its tools) or "export" (the GGUF writer)."""
    return importlib.import_module(f"{LLAMA_CPP}.{part}")


def _llama_tools(llama_bench: Path | None, config: LMConfig, *needed: str) -> Any:
    """llama.cpp's tools (its LlamaTools) beside the llama-bench binary (None without one), the
    binaries needed present there, and config's vanilla twin one a GGUF file can hold."""
    if llama_bench is None:
        return None
    tools = _llama_cpp().LlamaTools.beside(llama_bench)
    for name in needed:
        if not llama_bench.with_name(name).is_file():
            raise UsageError(f"{llama_bench.with_name(name)} is missing (scripts/build_llama_cpp.sh builds it)")
    _llama_cpp("export").check_writable_as_gguf(config.replace(quantization=None, quantized_linears=()).vanilla())
    return tools


def run_lm_bench(
    *,
    layers: int = 2,
    departments: int = 4,
    steps: int = 32,
    prompt: int = 16,
    threads: int = 2,
    runtimes: tuple[str, ...] = RUNTIMES,
    twins: tuple[str, ...] = TWINS,
    seed: int = 0,
    progress=print,
    max_memory: float = 8 * 2**30,
    quant: QuantConfig | None = None,
    linears: tuple[str, ...] = (),
    attention: str = "gqa",
    llama_bench: Path | None = None,
    llama_tokens: int = 64,
    gguf_dir: Path | None = None,
) -> dict:
    progress = progress or (lambda *_: None)
    from ..lm.model import DeaMoELM

    config = _quantized(bench_config(layers, departments, attention=attention), quant, linears)
    tools = _llama_tools(llama_bench, config)
    if "cpu-native" in runtimes:
        from ..cpu.model_step import unsupported

        reason = unsupported(config)
        if reason:
            raise UsageError(f"{reason}; leave cpu-native out of the runtimes")
    need = max(memory_estimate(config, r) for r in runtimes)
    # llama-bench maps its GGUF file (page cache, evictable; its repacked Q4_0 copy is a
    # tenth of our twins' FFNs), so llama.cpp adds nothing here.
    if need > max_memory:
        raise UsageError(
            f"this benchmark would need about {format_bytes(need)} (over --max-memory {format_bytes(max_memory)}); "
            "use fewer --layers or --departments"
        )
    progress(
        f"model: {layers} blocks, d={config.hidden_size}, {config.moe.num_experts} experts, {_weights(config)}, "
        f"seed {seed}"
    )
    torch.manual_seed(seed)
    # DeaMoELM.random of a quantized config is this float model quantized; llama.cpp gets
    # the float model's vanilla twin, which its own tool quantizes.
    base = DeaMoELM.random(config.replace(quantization=None, quantized_linears=()), seed=seed, dtype=torch.float16)
    with contextlib.ExitStack() as stack:
        llama = None
        if tools is not None:
            folder = gguf_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-lm-gguf-")))
            llama = _LlamaContenders(tools, base, folder, threads, progress)
        if quant is not None:
            base = base.quantized(quant, linears=config.quantized_linears)
        result = _run_contenders(
            base, config, runtimes, twins, steps, prompt, threads, seed, progress, llama, llama_tokens
        )
    return result


def _run_contenders(base, config, runtimes, twins, steps, prompt, threads, seed, progress, llama, llama_tokens):
    from .bandwidth import kernel_bandwidth

    b = BYTES_PER_WEIGHT[torch.float16]
    prompt_ids = torch.randint(0, config.vocab_size, (prompt,), generator=torch.Generator().manual_seed(seed)).tolist()
    quality = {}
    if llama is not None:
        progress(f"  held-out perplexity ({PPL_CHUNKS} chunks of {PPL_CONTEXT} tokens) of the PyTorch models ...")
        quality = _our_perplexity(base, twins, llama.held_out)
    roofs = [kernel_bandwidth(1 << 29, 5, threads)["bytes_per_s"]]
    rows: list[dict] = []
    for runtime in runtimes:
        contenders = []
        for twin in twins:
            progress(f"  building {twin} on {runtime} ...")
            contenders.append(_contender(base, twin, runtime, threads))
            gc.collect()
        for c in contenders:  # prefill and one untimed step: first-call costs stay out
            c.token = c.untimed = int(np.argmax(c.decoder.prefill(prompt_ids)))
            c.token = int(np.argmax(c.decoder.step(c.token)))
            if runtime == "cpu":
                c.sink.clear()
        progress(
            f"  {steps} decode steps on {runtime}{' and llama.cpp' if llama else ''}, "
            f"interleaved in bursts of {min(BURST, steps)} ..."
        )
        bursts = -(-steps // BURST)
        for burst in range(bursts):
            # LLAMA_ROUNDS calls per file, spread over the bursts (together when there are fewer)
            for _ in range(sum(i * bursts // LLAMA_ROUNDS == burst for i in range(LLAMA_ROUNDS)) if llama else 0):
                llama.time_round(llama_tokens, prompt)
            roofs.append(kernel_bandwidth(ROOF_PROBE_BYTES, 3, threads)["bytes_per_s"])
            for c in contenders:
                for k in range(min(BURST, steps - burst * BURST)):
                    c.fed.append(c.token)
                    start = time.perf_counter()
                    logits = c.decoder.step(c.token)
                    c.token = int(np.argmax(logits))
                    (c.switch_s if k == 0 else c.step_s).append(time.perf_counter() - start)
        rows.extend(_row(c, config, b, steps) for c in contenders)
        replays = [(row, c.twin, c.untimed, c.fed) for c, row in zip(contenders, rows[-len(contenders) :], strict=True)]
        del contenders, c  # the loop variable would keep the last contender's weights alive
        gc.collect()
        if runtime == "cpu-native":  # once the native weights are freed: one twin's FFNs at a time
            for row, twin, untimed, fed in replays:
                row["ffn_bytes_per_token"] = _replayed_ffn_bytes(base, twin, untimed, fed, prompt_ids, threads, b)
                gc.collect()
    if llama is not None:
        rows.extend(llama.rows())
    roofs.append(kernel_bandwidth(1 << 29, 5, threads)["bytes_per_s"])
    roof = statistics.median(roofs)
    # FFN bytes for ORT rows: the same twin's count from the CPU run (same model, same tokens).
    # Outside the FFNs the CPU runtime reads float32 copies (deamoe_trt.runtimes.cpu_kernel), ORT fp16.
    by_twin = {r["twin"]: r["ffn_bytes_per_token"] for r in rows if r["ffn_bytes_per_token"]}
    for r in rows:
        if r["runtime"] != LLAMA:
            ffn = r["ffn_bytes_per_token"] = r["ffn_bytes_per_token"] or by_twin.get(r["twin"])
            if ffn:
                # cpu runs quantized projections dequantized, in float32
                other = _other_bytes(config.replace(quantized_linears=()), 4) if r["runtime"] == "cpu" else None
                r["bytes_per_token"] = ffn + (other or _other_bytes(config, b))
            r["perplexity"] = quality.get(r["twin"])
        if r["bytes_per_token"]:
            r["roof_ms"] = r["bytes_per_token"] / roof * 1e3
            r["of_roof"] = r["roof_ms"] / r["tpot_ms"]
    matching = next(
        (r for r in rows if r["runtime"] == LLAMA and r["gguf_type"] == _llama_cpp().MATCHING_TYPE[_bits(config)]),
        None,
    )
    for r in rows:
        r["vs_llama"] = matching["tpot_ms"] / r["tpot_ms"] if matching and r["runtime"] != LLAMA else None
    for runtime in runtimes:
        ref = {r["twin"]: r["tpot_ms"] for r in rows if r["runtime"] == runtime}
        for r in rows:
            if r["runtime"] == runtime:
                r["vs_expanded"] = ref["expanded"] / r["tpot_ms"] if "expanded" in ref else None
                r["vs_vanilla"] = ref["vanilla"] / r["tpot_ms"] if "vanilla" in ref else None
    from ..resources import peak_rss_bytes

    return {
        "peak_rss_bytes": peak_rss_bytes(),
        "config": config.to_dict(),
        "dtype": "float16",
        "threads": threads,
        "steps": steps,
        "burst": min(BURST, steps),
        "prompt_tokens": prompt,
        "roof_bytes_per_s": roofs,
        "rows": rows,
        "llama_cpp": None if llama is None else llama.describe(llama_tokens),
        "perplexity": None if llama is None else {"context": PPL_CONTEXT, "chunks": PPL_CHUNKS},
    }


def _bits(config) -> int | None:
    return None if config.quantization is None else config.quantization.bits


def held_out_ids(vocab_size: int) -> torch.Tensor:
    """The held-out 10% of the shipped text as byte-tokenizer ids (what train-tiny validates on)."""
    from ..lm.tokenizer import ByteTokenizer
    from ..train.lm import TrainSettings, shipped_text, split_text

    return split_text(shipped_text(), ByteTokenizer(vocab_size=vocab_size), TrainSettings().val_fraction)[1]


def _our_perplexity(base, twins, ids: torch.Tensor) -> dict[str, float]:
    """Held-out perplexity of each twin's PyTorch model (expanded: the DeaMoE model's function)."""
    out = {}
    for twin in ("deamoe", "vanilla"):
        if twin in twins or (twin == "deamoe" and "expanded" in twins):
            model = base.twin(twin).eval()
            out[twin] = _llama_cpp().chunked_perplexity(model, ids, PPL_CONTEXT, PPL_CHUNKS)
            del model
            gc.collect()
    if "deamoe" in out:
        out["expanded"] = out["deamoe"]
    return out


class _LlamaContenders:
    """The vanilla twin as F16, Q8_0 and Q4_0 GGUF files in folder, each scored on the
    held-out text by llama-perplexity and timed by llama-bench one call at a time."""

    def __init__(self, tools, base, folder: Path, threads: int, progress, kinds=None, score=True):
        """kinds: the GGUF types written (f16 always; default every type llama.cpp's GGUF_TYPES
        names); score: their perplexities too."""
        from ..lm.tokenizer import ByteTokenizer

        llama_cpp = _llama_cpp()
        kinds = llama_cpp.GGUF_TYPES if kinds is None else kinds
        self.llama_cpp = llama_cpp

        self.tools, self.threads = tools, threads
        kinds = ("f16", *(k for k in kinds if k != "f16"))
        progress(f"  writing the vanilla twin as GGUF ({', '.join(kinds)}) in {folder} ...")
        vanilla = base.vanilla()
        self.files = {"f16": _llama_cpp("export").write_gguf(vanilla, folder / "vanilla-f16.gguf")}
        del vanilla
        gc.collect()
        for kind in kinds[1:]:
            target = folder / f"vanilla-{kind}.gguf"
            self.files[kind] = llama_cpp.quantize(tools, self.files["f16"], target, kind, threads)
        self.samples: dict[str, list] = {kind: [] for kind in self.files}  # llama_cpp.BenchSample
        self.perplexity: dict[str, float] = {}
        if not score:
            return
        self.held_out = held_out_ids(base.config.vocab_size)
        text = folder / "held-out.txt"
        text.write_text(ByteTokenizer(vocab_size=base.config.vocab_size).decode(self.held_out.tolist()))
        progress("  held-out perplexity of the GGUF files (llama-perplexity) ...")
        self.perplexity = {
            kind: llama_cpp.perplexity(tools, path, text, n_ctx=PPL_CONTEXT, threads=threads, chunks=PPL_CHUNKS)
            for kind, path in self.files.items()
        }

    def time_round(self, tokens: int, depth: int) -> None:
        for kind, path in self.files.items():
            self.samples[kind].append(
                self.llama_cpp.bench(self.tools, path, tokens=tokens, depth=depth, threads=self.threads)
            )

    def rows(self) -> list[dict]:
        rows = []
        for kind, path in self.files.items():
            per_token = [s.seconds_per_token for s in self.samples[kind]]
            rows.append(
                {
                    "twin": "vanilla",
                    "runtime": LLAMA,
                    "gguf_type": kind,
                    "tpot_ms": statistics.median(per_token) * 1e3,
                    "mean_ms": statistics.fmean(per_token) * 1e3,
                    "step_ms": [t * 1e3 for t in per_token],  # per call: the mean of its decode steps
                    "ffn_bytes_per_token": None,
                    "bytes_per_token": self.llama_cpp.bytes_per_token(path),
                    "perplexity": self.perplexity[kind],
                }
            )
        return rows

    def describe(self, tokens: int) -> dict:
        sample = next(s for samples in self.samples.values() for s in samples)
        return {
            "build": sample.build,
            "cpu": sample.cpu,
            "command": f"llama-bench -m FILE -p 0 -n {tokens} -d PROMPT -t {self.threads} -r 1 -o json",
            "calls_per_file": len(next(iter(self.samples.values()))),
            "tensor_types": {kind: self.llama_cpp.gguf_type_summary(path) for kind, path in self.files.items()},
        }


def _counted_ffn_bytes(c: Contender, b: int, steps: int) -> float:
    """Mean FFN bytes a step of a recording CPU contender loaded over its last `steps` steps."""
    moe_layers = list(c.layers)
    per_step = len(moe_layers)
    hidden = c.sink[-steps * per_step :]
    total = 0
    for s in range(steps):
        for j, i in enumerate(moe_layers):
            kernel = c.layers[i]  # its own routing, from the hidden state this contender saw
            routing = kernel.route(hidden[s * per_step + j])
            total += weights_loaded(kernel.config, routing, b, kernel.quant).total
    return total / steps


def _replayed_ffn_bytes(
    base, twin: str, untimed: int, fed: list[int], prompt_ids: list[int], threads: int, b: int
) -> float:
    """FFN bytes per step of a native-step contender: its prompt, untimed step and timed tokens
    fed again, after the timing, to the recording (PyTorch-attention) decoder of the same
    twin, which computes the same function, so the routing counted is the one the native
    step ran."""
    replay = _contender(base, twin, "cpu", threads)
    replay.decoder.prefill(prompt_ids)
    replay.decoder.step(untimed)
    replay.sink.clear()
    for token in fed:
        replay.decoder.step(token)
    return _counted_ffn_bytes(replay, b, len(fed))


def _row(c: Contender, config, b: int, steps: int) -> dict:
    ffn_bytes = _counted_ffn_bytes(c, b, steps) if c.runtime == "cpu" else None
    steady = c.step_s or c.switch_s  # a run of one step per burst has no steady steps
    return {
        "twin": c.twin,
        "runtime": c.runtime,
        "tpot_ms": statistics.median(steady) * 1e3,
        "mean_ms": statistics.fmean(steady) * 1e3,
        "step_ms": [s * 1e3 for s in c.step_s],
        "switch_ms": [s * 1e3 for s in c.switch_s],
        "ffn_bytes_per_token": ffn_bytes,
        "bytes_per_token": None,
    }


def lm_bench_table(result: dict) -> str:
    names = {"deamoe": "DeaMoE", "expanded": "expanded twin", "vanilla": "vanilla twin"}
    rt = {
        "cpu": "CPU kernel, PyTorch attention",
        "cpu-native": "CPU kernel, native step",
        "ort": "ONNX Runtime (ort form)",
    }
    llama = result.get("llama_cpp")
    rows = []
    for r in result["rows"]:
        runtime = f"llama.cpp {r['gguf_type']}" if r["runtime"] == LLAMA else rt[r["runtime"]]
        row = [
            f"{names[r['twin']]}, {runtime}",
            format_bytes(r["bytes_per_token"]) if r.get("bytes_per_token") else "?",
            f"{r['tpot_ms']:.2f}",
            f"{r['of_roof']:.0%}" if r.get("of_roof") else "",
            f"{r['vs_expanded']:.2f}x" if r.get("vs_expanded") and r["twin"] != "expanded" else "",
            f"{r['vs_vanilla']:.2f}x" if r.get("vs_vanilla") and r["twin"] != "vanilla" else "",
        ]
        if llama:
            row += [f"{r['vs_llama']:.2f}x" if r.get("vs_llama") else "", _ppl(r.get("perplexity"))]
        rows.append(row)
    headers = ["contender", "weights/token", "TPOT ms", "of roof", "vs expanded", "vs vanilla"]
    if llama:
        headers += [f"vs llama.cpp {_llama_cpp().MATCHING_TYPE[_bits(LMConfig.from_dict(result['config']))]}", "PPL"]
    c = result["config"]
    weights = _weights(LMConfig.from_dict(c))
    title = (
        f"Whole-model TPOT: {c['num_layers']} blocks, d={c['hidden_size']}"
        f"{', MLA' if c.get('kv_lora_rank') else ''}, {c['moe']['num_departments']} x "
        f"{c['moe']['experts_per_department']} experts, {weights}, {result['threads']} threads, "
        f"{result['steps']} steps in interleaved bursts of {result['burst']} (median), "
        f"peak RSS {format_bytes(result['peak_rss_bytes'])}"
    )
    table = format_table(headers, rows, title=title)
    roofs = [r / 1e9 for r in result["roof_bytes_per_s"]]
    table += (
        f"\nroof: {statistics.median(roofs):.1f} GB/s read (median of {len(roofs)} measurements, before, after and "
        f"one per burst; {min(roofs):.1f} to {max(roofs):.1f})"
    )
    switch = [
        statistics.median(r["switch_ms"]) / r["tpot_ms"] - 1
        for r in result["rows"]
        if r.get("switch_ms") and r["step_ms"]
    ]
    if switch:
        table += (
            f"\nTPOT: median of the steps that followed the contender's own; the first step of each burst, "
            f"after another contender's, took {min(switch):+.0%} to {max(switch):+.0%} longer (median) and is left out"
        )
    if llama:
        p = result["perplexity"]
        table += (
            f"\nllama.cpp {llama['build']}: {llama['command']}, {llama['calls_per_file']} calls per file "
            "interleaved with the runtimes' steps (median of calls)"
            f"\nPPL: held-out shipped text, llama-perplexity's protocol ({p['chunks']} chunks of {p['context']} "
            "tokens, second halves counted); llama.cpp rows by llama-perplexity, the others by the PyTorch reference"
        )
    return table


def _ppl(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def _weights(config) -> str:
    """fp16, or how the FFN weights are quantized beside it."""
    q = config.quantization
    parts = "".join(f", {p}" for p in config.quantized_linears)
    return "fp16" if q is None else f"fp16, FFNs{parts} int{q.bits} group {q.group_size}"


def write_plot(result: dict, path: Path) -> Path:
    """TPOT per contender, bars grouped by runtime, with each twin's roof (bytes / bandwidth)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    runtimes = list(dict.fromkeys(r["runtime"] for r in result["rows"]))
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.25
    for k, twin in enumerate(TWINS):
        xs, ys, roofs = [], [], []
        for j, runtime in enumerate(runtimes):
            row = next((r for r in result["rows"] if r["twin"] == twin and r["runtime"] == runtime), None)
            if row:
                xs.append(j + (k - 1) * width)
                ys.append(row["tpot_ms"])
                roofs.append(row.get("roof_ms") or 0)
        ax.bar(xs, ys, width, label=twin)
        ax.scatter(xs, roofs, marker="_", s=300, color="black", zorder=3)
    labels = {
        "cpu": "CPU kernel + PyTorch",
        "cpu-native": "CPU kernel, native",
        "ort": "ONNX Runtime",
        LLAMA: "llama.cpp (f16)",
    }
    ax.set_xticks(range(len(runtimes)), [labels[r] for r in runtimes])
    ax.set_ylabel("TPOT, ms (median)")
    c = result["config"]
    weights = _weights(LMConfig.from_dict(c))
    ax.set_title(f"{c['num_layers']}-block DeaMoE LM, {weights}; black: the read roof of each twin's bytes", fontsize=9)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------
# Several sequences per step (`bench-lm --sequences`)

LLAMA_BATCHED = "llama-batched-bench"


@dataclass
class BatchContender:
    """One twin decoding `sequences` sequences together on a runtime's batch decoder."""

    twin: str
    sequences: int
    batch: BatchDecoder  # NativeBatchDecoder, CudaBatchDecoder, ...
    prompts: list[list[int]]
    seqs: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # the next token of each sequence
    untimed: list[int] = field(default_factory=list)  # each sequence's token of the untimed step
    fed: list[list[int]] = field(default_factory=list)  # per timed step, every sequence's token
    step_s: list[float] = field(default_factory=list)
    switch_s: list[float] = field(default_factory=list)


# The runtimes whose batch decoder reads each weight once for all a step's sequences (the
# CPU kernel's batches in its native mode, named so here).
BATCH_RUNTIMES = tuple(
    f"{name}-native" if "native" in registry.get(name).capabilities.modes else name
    for name in registry.names(can="batched")
)
BATCH_LABELS = {
    "cpu-native": "CPU kernel, native step",
    "cuda": "CUDA decoder",
    "cuda-emulated": "CUDA decoder, SIMT-emulated",
}


class _Roof:
    """The bandwidth a runtime's steps are held to, measured as they run: the CPU kernel's
    streaming read (cpu-native), a device-to-device copy with torch (cuda); none under the
    emulator, whose kernels run on the CPU."""

    def __init__(self, runtime: str, threads: int):
        self.runtime, self.threads = runtime, threads
        self.method = {
            "cpu-native": "C++ streaming read with the kernel's threads",
            "cuda": "device-to-device copy (torch), read + write bytes",
        }.get(runtime)

    def __call__(self, nbytes: int, passes: int) -> list[float]:
        from .bandwidth import device_copy_bandwidth, kernel_bandwidth

        if self.runtime == "cpu-native":
            return [kernel_bandwidth(nbytes, passes, self.threads)["bytes_per_s"]]
        if self.runtime == "cuda":
            return [device_copy_bandwidth(nbytes, passes)["bytes_per_s"]]
        return []


def _batch_decoder(runtime: str, model, twin: str, max_sequences: int, threads: int, context: int):
    if runtime == "cpu-native":
        return registry.get("cpu").batch_decoder(
            model, max_sequences=max_sequences, threads=threads, twin=twin, step="native"
        )
    return registry.get(runtime).batch_decoder(model, max_sequences=max_sequences, twin=twin, max_context=context)


def _batch_prompts(sequences: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """sequences random prompts of length ids; the same for every twin of one sequence count."""
    gen = torch.Generator().manual_seed(seed * 7919 + sequences)
    return [torch.randint(0, vocab, (length,), generator=gen).tolist() for _ in range(sequences)]


def run_lm_batch_bench(
    *,
    sequences: tuple[int, ...],
    layers: int = 2,
    departments: int = 4,
    steps: int = 32,
    prompt: int = 16,
    threads: int = 2,
    twins: tuple[str, ...] = TWINS,
    seed: int = 0,
    progress=print,
    max_memory: float = 8 * 2**30,
    quant: QuantConfig | None = None,
    linears: tuple[str, ...] = (),
    llama_bench: Path | None = None,
    llama_tokens: int = 32,
    gguf_dir: Path | None = None,
    runtime: str = "cpu-native",
    attention: str = "gqa",
    model_config: LMConfig | None = None,
) -> dict:
    """Aggregate tokens/s of runtime's batch decoder (BATCH_RUNTIMES) at each count of
    sequences, every twin and count a contender, their steps interleaved in bursts; llama.cpp's
    llama-batched-bench on the vanilla twin (GGUF f16 and the type matching --quantized) at
    the same counts, called between the bursts. Bytes per step: the FFN weights the batch's
    routing reads (its union over the sequences, deamoe_trt.traffic; from each sequence's
    tokens fed again after the timing on the recording decoder, which computes the same
    function), plus every other weight once and one embedding row per sequence (on cuda, the
    projections in the model's dtype: its decoder dequantizes them). model_config: this model
    instead of bench_config's (float16 weights; small ones check the flow)."""
    progress = progress or (lambda *_: None)
    from ..cpu.model_step import unsupported
    from ..lm.model import DeaMoELM
    from ..runtimes.base import check_max_sequences

    if runtime not in BATCH_RUNTIMES:
        raise UsageError(f"batched decoding runs on {', '.join(BATCH_RUNTIMES)}, got {runtime!r}")
    if runtime != "cpu-native":
        reason = registry.get(runtime).available()
        if reason is not None:  # before anything is built: nothing to run it on
            raise UsageError(f"--runtimes {runtime} {reason}")
        if llama_bench is not None:
            raise UsageError("--llama-bench times llama.cpp on the CPU; with --sequences give --runtimes cpu-native")
    if not sequences or any(n < 1 for n in sequences):
        raise UsageError(f"--sequences takes counts of 1 or more, got {sequences}")
    sequences = tuple(dict.fromkeys(sequences))
    check_max_sequences(sum(sequences))
    config = _quantized(model_config or bench_config(layers, departments, attention=attention), quant, linears)
    reason = unsupported(config) if runtime == "cpu-native" else None
    if reason:
        raise UsageError(reason)
    tools = _llama_tools(llama_bench, config, "llama-batched-bench")
    need = memory_estimate(config, "cpu-native")
    if need > max_memory:
        raise UsageError(
            f"this benchmark would need about {format_bytes(need)} (over --max-memory {format_bytes(max_memory)}); "
            "use fewer --layers or --departments"
        )
    progress(
        f"model: {config.num_layers} blocks, d={config.hidden_size}, {config.moe.num_experts} experts, "
        f"{_weights(config)}, seed {seed}; sequences {','.join(map(str, sequences))} on {runtime}"
    )
    base = DeaMoELM.random(config.replace(quantization=None, quantized_linears=()), seed=seed, dtype=torch.float16)
    matching = _llama_cpp().MATCHING_TYPE[_bits(config)] if tools is not None else None
    with contextlib.ExitStack() as stack:
        llama = None
        if tools is not None:
            folder = gguf_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-lm-gguf-")))
            llama = _LlamaContenders(tools, base, folder, threads, progress, kinds=("f16", matching), score=False)
        if quant is not None:
            base = base.quantized(quant, linears=config.quantized_linears)
        probe = _Roof(runtime, threads)
        roofs = probe(1 << 29, 5)
        # The cache a CUDA decoder allocates (and every step attends over): what the run fills.
        context = min(config.max_position_embeddings, prompt + steps + 2)
        decoders = {}
        for twin in twins:
            progress(f"  building {twin} on {runtime}, {sum(sequences)} sequence slots ...")
            decoders[twin] = _batch_decoder(runtime, base, twin, sum(sequences), threads, context)
            gc.collect()
        contenders = []
        for n in sequences:
            prompts = _batch_prompts(n, prompt, config.vocab_size, seed)
            for twin in twins:
                c = BatchContender(twin, n, decoders[twin], prompts)
                for ids in prompts:  # prefill and one untimed step: first-call costs stay out
                    seq, logits = c.batch.open(ids)
                    c.seqs.append(seq)
                    c.tokens.append(int(np.argmax(logits)))
                c.untimed = list(c.tokens)
                c.tokens = [int(t) for t in np.argmax(c.batch.step(c.seqs, c.tokens), axis=1)]
                contenders.append(c)
        # llama.cpp's BatchedSamples per GGUF type
        llama_samples: dict[str, list] = {k: [] for k in (llama.files if llama else {})}
        bursts = -(-steps // BURST)
        progress(
            f"  {steps} batched steps per contender{' and llama-batched-bench' if llama else ''}, "
            f"interleaved in bursts of {min(BURST, steps)} ..."
        )
        for burst in range(bursts):
            for _ in range(sum(i * bursts // LLAMA_ROUNDS == burst for i in range(LLAMA_ROUNDS)) if llama else 0):
                for kind, path in llama.files.items():
                    llama_samples[kind] += llama.llama_cpp.batched_bench(
                        tools, path, sequences=sequences, tokens=llama_tokens, depth=prompt, threads=threads
                    )
            roofs += probe(ROOF_PROBE_BYTES, 3)
            for c in contenders:
                for k in range(min(BURST, steps - burst * BURST)):
                    c.fed.append(list(c.tokens))
                    start = time.perf_counter()
                    logits = c.batch.step(c.seqs, c.tokens)
                    c.tokens = [int(t) for t in np.argmax(logits, axis=1)]
                    (c.switch_s if k == 0 else c.step_s).append(time.perf_counter() - start)
        timed = [
            (c.twin, c.sequences, c.prompts, c.untimed, c.fed, c.step_s or c.switch_s, c.switch_s) for c in contenders
        ]
        del contenders, decoders, c
        gc.collect()
        roofs += probe(1 << 29, 5)
        b = BYTES_PER_WEIGHT[torch.float16]
        # The CUDA decoder runs int8/int4 projections dequantized (runtimes.cuda_decoder).
        outside = _other_bytes(config if runtime == "cpu-native" else config.replace(quantized_linears=()), b)
        rows: list[dict] = []
        progress("  counting each batch's bytes per step (its tokens fed again on the recording decoder) ...")
        for twin in twins:
            replay = _contender(base, twin, "cpu", threads)
            for t, n, prompts, untimed, fed, steady, switch in timed:
                if t != twin:
                    continue
                ffn, experts_read = _batch_ffn_bytes(replay, prompts, untimed, fed[: min(BURST, steps)], b)
                rows.append(
                    {
                        "twin": twin,
                        "runtime": runtime,
                        "sequences": n,
                        "tpot_ms": statistics.median(steady) * 1e3,
                        "step_ms": [x * 1e3 for x in steady],
                        "switch_ms": [x * 1e3 for x in switch],
                        "bytes_per_step": ffn + outside + (n - 1) * config.hidden_size * b,
                        "experts_read": experts_read,
                    }
                )
            del replay
            gc.collect()
        if llama is not None:
            read = {r["sequences"]: r["experts_read"] for r in rows if r["twin"] == "vanilla"}
            for kind, path in llama.files.items():
                for n in sequences:
                    per_step = [x.seconds_per_step for x in llama_samples[kind] if x.sequences == n]
                    fraction = read.get(n)
                    rows.append(
                        {
                            "twin": "vanilla",
                            "runtime": LLAMA_BATCHED,
                            "gguf_type": kind,
                            "sequences": n,
                            "tpot_ms": statistics.median(per_step) * 1e3,
                            "step_ms": [x * 1e3 for x in per_step],
                            "bytes_per_step": llama.llama_cpp.bytes_per_token(path, experts_read=fraction, tokens=n)
                            if fraction is not None or n == 1
                            else None,
                        }
                    )
    roof = statistics.median(roofs) if roofs else None
    for r in rows:
        r["tokens_per_s"] = r["sequences"] / r["tpot_ms"] * 1e3
        if r["bytes_per_step"] and roof:
            r["of_roof"] = r["bytes_per_step"] / roof * 1e3 / r["tpot_ms"]
        same = [o for o in rows if o["runtime"] == r["runtime"] and o.get("gguf_type") == r.get("gguf_type")]
        one = next((o for o in same if o["twin"] == r["twin"] and o["sequences"] == 1), None)
        r["vs_one"] = r["tokens_per_s"] / one["tokens_per_s"] if one else None
        for twin in ("expanded", "vanilla"):
            other = next((o for o in same if o["twin"] == twin and o["sequences"] == r["sequences"]), None)
            r[f"vs_{twin}"] = other["tpot_ms"] / r["tpot_ms"] if other and r["runtime"] != LLAMA_BATCHED else None
        peer = next(
            (
                o
                for o in rows
                if o["runtime"] == LLAMA_BATCHED and o["gguf_type"] == matching and o["sequences"] == r["sequences"]
            ),
            None,
        )
        mine = r["runtime"] != LLAMA_BATCHED
        r["vs_llama"] = peer["tpot_ms"] / r["tpot_ms"] if peer and mine else None
        both = peer is not None and mine and peer["bytes_per_step"] and r["bytes_per_step"]
        r["llama_bytes_ratio"] = peer["bytes_per_step"] / r["bytes_per_step"] if peer is not None and both else None
    from ..resources import peak_rss_bytes

    return {
        "peak_rss_bytes": peak_rss_bytes(),
        "config": config.to_dict(),
        "dtype": "float16",
        "threads": threads,
        "steps": steps,
        "burst": min(BURST, steps),
        "prompt_tokens": prompt,
        "sequences": list(sequences),
        "runtime": runtime,
        "device": torch.cuda.get_device_name() if runtime == "cuda" else None,
        "roof_method": probe.method,
        "roof_bytes_per_s": roofs,
        "rows": rows,
        "llama_cpp": None
        if llama is None
        else {
            "matching": matching,
            "command": f"llama-batched-bench -m FILE -npp {prompt} -ntg {llama_tokens} "
            f"-npl {','.join(map(str, sequences))} -t {threads} -tb {threads} --output-format jsonl",
            "calls_per_file": LLAMA_ROUNDS,
        },
    }


def _batch_ffn_bytes(replay: Contender, prompts, untimed, fed, b: int) -> tuple[float, float]:
    """Mean FFN bytes per batched step over the steps in fed (per step, every sequence's token),
    and the mean fraction of each block's experts read: each sequence's prompt, untimed and
    fed tokens run one sequence at a time on the recording decoder, then each step's hidden
    states of all the sequences routed together (the union a batched step reads)."""
    moe = list(replay.layers)
    hidden = []  # per sequence: its recorded FFN inputs, per step per block
    for i, ids in enumerate(prompts):
        replay.decoder.prefill(ids)
        replay.decoder.step(untimed[i])
        replay.sink.clear()
        for step in fed:
            replay.decoder.step(step[i])
        hidden.append(list(replay.sink))
    total, read = 0.0, []
    for s in range(len(fed)):
        for j, block in enumerate(moe):
            kernel = replay.layers[block]
            x = torch.cat([h[s * len(moe) + j] for h in hidden])
            traffic = weights_loaded(kernel.config, kernel.route(x), b, kernel.quant)
            total += traffic.total
            read.append(traffic.experts_used / kernel.config.num_experts)
    return total / len(fed), statistics.fmean(read)


def lm_batch_table(result: dict) -> str:
    names = {"deamoe": "DeaMoE", "expanded": "expanded twin", "vanilla": "vanilla twin"}
    llama = result.get("llama_cpp")
    rows = []
    for r in sorted(result["rows"], key=lambda r: r["sequences"]):
        who = f"llama.cpp {r['gguf_type']}" if r["runtime"] == LLAMA_BATCHED else BATCH_LABELS[r["runtime"]]
        row = [
            f"{names[r['twin']]}, {who}",
            r["sequences"],
            format_bytes(r["bytes_per_step"]) if r.get("bytes_per_step") else "?",
            f"{r['tpot_ms']:.2f}",
            f"{r['tokens_per_s']:.1f}",
            f"{r['vs_one']:.2f}x" if r.get("vs_one") else "",
            f"{r['of_roof']:.0%}" if r.get("of_roof") else "",
            f"{r['vs_expanded']:.2f}x" if r.get("vs_expanded") and r["twin"] != "expanded" else "",
            f"{r['vs_vanilla']:.2f}x" if r.get("vs_vanilla") and r["twin"] != "vanilla" else "",
        ]
        if llama:
            row += [
                f"{r['vs_llama']:.2f}x" if r.get("vs_llama") else "",
                f"{r['llama_bytes_ratio']:.2f}x" if r.get("llama_bytes_ratio") else "",
            ]
        rows.append(row)
    headers = ["contender", "sequences", "weights/step", "TPOT ms", "tokens/s", "vs 1 seq", "of roof"]
    headers += ["vs expanded", "vs vanilla"]
    if llama:
        headers += [f"vs llama.cpp {llama['matching']}", "its bytes / ours"]
    c = result["config"]
    title = (
        f"Batched decoding: {c['num_layers']} blocks, d={c['hidden_size']}, {c['moe']['num_departments']} x "
        f"{c['moe']['experts_per_department']} experts, {_weights(LMConfig.from_dict(c))}, "
        + (f"{result['threads']} threads, " if result.get("runtime", "cpu-native") == "cpu-native" else "")
        + (f"{result['device']}, " if result.get("device") else "")
        + f"{result['steps']} batched steps per contender in interleaved bursts of {result['burst']} (median), "
        f"prompts of {result['prompt_tokens']} tokens, peak RSS {format_bytes(result['peak_rss_bytes'])}"
    )
    table = format_table(headers, rows, title=title)
    roofs = [r / 1e9 for r in result["roof_bytes_per_s"]]
    kind = "device-to-device copy, read + write" if result.get("runtime") == "cuda" else "read"
    roof = (
        f"roof: {statistics.median(roofs):.1f} GB/s {kind} (median of {len(roofs)} measurements; "
        f"{min(roofs):.1f} to {max(roofs):.1f})"
        if roofs
        else "roof: not measured (the emulated kernels run on the CPU: these times check the flow, not a GPU)"
    )
    table += (
        f"\n{roof}; TPOT: a batched step (one token for every sequence); "
        "tokens/s: sequences / TPOT; weights/step: the union the batch's routing reads"
    )
    if llama:
        table += (
            f"\nllama.cpp: {llama['command']}, {llama['calls_per_file']} calls per file interleaved with the "
            "bursts (median of calls); its weights/step count the experts our vanilla twin's batch read"
        )
    return table
