"""A whole Hugging Face MoE language model (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE, gpt-oss;
Granite MoE, ERNIE-4.5-MoE and DeepSeek-V2/V3 through deamoe_trt.importers.families) as a
deamoe-trt language-model checkpoint, streamed tensor by tensor.

Everything is read from the directory's config.json and safetensors; transformers is not
needed and no code from the directory runs. The import is exact: attention, norms, dense
MLPs, embeddings and head are copied; each MoE block becomes a one-department DeaMoE layer
(D = 1, f_s = 0: the spec's vanilla special case) with the router, experts and Qwen2-MoE's
gated shared expert copied into the canonical tensors.

Order of work, so that bad input leaves nothing behind:
1. config.json -> LMConfig (unsupported architectures, remote code, quantized weights and
   options deamoe-trt does not implement are refused here, in one line);
2. the checkpoint's headers are indexed and every tensor the model needs is checked for
   presence, shape and dtype; tensors nobody reads are refused too (a variant this importer
   does not know would otherwise be silently dropped);
3. the output's safetensors header is written from the config, then the data block by
   block, each tensor (each expert's rows) read, converted and appended in turn; peak memory
   is about the largest tensor plus the shards' pages of one block. The file grows in
   OUTPUT.work (deamoe_trt.work_folder) with a record of the blocks it holds whole: a killed
   import rerun with the same arguments (and unchanged shards) writes only the blocks after them;
4. tokenizer files, then config.json, beside it; the folder then replaces OUTPUT.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, TextIO

import torch

from .._io import atomic_write_text, check_replaceable, json_format_is, read_json, replaced_directory
from ..checkpoint import CONFIG_FILE, DTYPES, WEIGHTS_FILE, dtype_name
from ..config import ConfigError, top_k_moe
from ..errors import DeaMoEError, UsageError
from ..lm.config import LMConfig
from ..resources import peak_rss_bytes
from ..safetensors_io import ST_DTYPES, ShardReader, StreamingWriter, index_checkpoint
from ..work_folder import open_work, work_dir
from .derived import Derived
from .families import FAMILIES, gpt_oss
from .families.common import HFConfig, check_silu, dense_mlp, lm_fields, norms, rope_from_hf, routed_experts, shared_mlp
from .hf_directory import check_not_quantized, read_config_json, safetensors_files

# model_type -> the name users know it by.
SUPPORTED_LM_TYPES = {
    "qwen3_moe": "Qwen3-MoE",
    "qwen2_moe": "Qwen2-MoE",
    "mixtral": "Mixtral",
    "olmoe": "OLMoE",
    "gpt_oss": "gpt-oss",
    **{t: family.name for t, family in FAMILIES.items()},
}
# rope_theta when a config names none (each family's transformers default).
_DEFAULT_THETA = {"qwen3_moe": 10000.0, "qwen2_moe": 10000.0, "mixtral": 1e6, "olmoe": 10000.0}
_MLA_FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
# Tensors that are derived, not weights (old checkpoints saved the rotary frequencies).
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def supported_list() -> str:
    return ", ".join(f"{name} ({t})" for t, name in SUPPORTED_LM_TYPES.items())


def read_config(model_dir: Path) -> dict[str, Any]:
    """config.json of a model directory, refusing what cannot be imported as a whole model."""
    config = read_config_json(model_dir)
    path = model_dir / "config.json"
    # An export-hf directory names its remote code too; its config.json alone describes it.
    if config.get("auto_map") and config.get("model_type") != "deamoe":
        raise UsageError(
            f"{path} needs trust_remote_code (its auto_map names code in the model directory); "
            "deamoe-trt never runs code from a model directory"
        )
    model_type = config.get("model_type")
    if model_type not in FAMILIES and any(k in config for k in _MLA_FIELDS):
        raise UsageError(
            f"{path}: {model_type} uses multi-head latent attention (MLA) in an architecture deamoe-trt's language "
            "model does not implement (it runs DeepSeek-V2's and DeepSeek-V3's); import its MoE layers alone with "
            "--layers-only"
        )
    if model_type not in SUPPORTED_LM_TYPES:
        raise UsageError(f"unsupported architecture {model_type!r} in {path}; supported: {supported_list()}")
    if model_type == gpt_oss.MODEL_TYPE:
        gpt_oss.check_quantization(config, model_dir)  # its MXFP4 experts are read exactly
    else:
        check_not_quantized(config, model_dir)
    return config


def lm_config(hf: dict[str, Any], where: str = "config.json") -> LMConfig:
    """The LMConfig of a Hugging Face config.json (a dict), or a one-line UsageError."""
    t = hf["model_type"]
    if t == gpt_oss.MODEL_TYPE:
        return gpt_oss.lm_config(hf, where)
    if t in FAMILIES:
        try:
            return FAMILIES[t].lm_config(hf, where)
        except (ConfigError, TypeError, ValueError) as exc:
            raise UsageError(f"{where} has no deamoe-trt equivalent: {exc}") from None
    cfg = HFConfig(hf, where, SUPPORTED_LM_TYPES[t])
    get, need = cfg.get, cfg.need
    check_silu(cfg)
    layers = cfg.int("num_hidden_layers")
    hidden = cfg.int("hidden_size")

    theta, scaling = rope_from_hf(hf, _DEFAULT_THETA[t], where)

    # Attention variants.
    qkv_bias = o_bias = bool(get("attention_bias", False))
    if t == "qwen2_moe":
        qkv_bias, o_bias = bool(get("qkv_bias", True)), False
    qk_norm = {"qwen3_moe": "head", "olmoe": "full"}.get(t, "none")
    clip_qkv = float(get("clip_qkv", 0.0)) if t == "olmoe" else 0.0
    window, window_layers = _sliding_window(hf, t, layers)

    # FFNs: which blocks are MoE, and the MoE routing.
    experts = int(get("num_experts", get("num_local_experts", 0)))
    dense = _dense_layers(hf, t, layers, experts)
    if len(dense) == layers:
        raise UsageError(f"{where} describes a dense model (no MoE layers); deamoe-trt imports MoE models")
    expert_width = int(need("moe_intermediate_size") if t.startswith("qwen") else need("intermediate_size"))
    shared = int(get("shared_expert_intermediate_size", 0)) if t == "qwen2_moe" else 0
    try:
        moe = top_k_moe(
            hidden_size=hidden,
            num_experts=experts,
            intermediate_size=expert_width,
            top_k=int(need("num_experts_per_tok")),
            # Mixtral always renormalises its top-k probabilities; the others say whether they do.
            norm_topk_prob=True if t == "mixtral" else bool(get("norm_topk_prob", False)),
            shared_expert_intermediate_size=shared,
            shared_expert_gate=shared > 0,
        )
        return LMConfig(
            **lm_fields(cfg, rms_norm_eps=1e-6),
            moe=moe,
            rope_theta=theta,
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            qk_norm=qk_norm,
            clip_qkv=clip_qkv,
            rope_scaling=scaling,
            sliding_window=window,
            sliding_window_layers=window_layers,
            dense_layers=tuple(dense),
            dense_intermediate_size=int(get("intermediate_size", 0)) if dense else 0,
        )
    except (ConfigError, TypeError, ValueError) as exc:
        raise UsageError(f"{where} has no deamoe-trt equivalent: {exc}") from None


def _sliding_window(hf: dict[str, Any], t: str, layers: int) -> tuple[int, tuple[int, ...] | None]:
    """(window, layers it applies to; None: all) as transformers 5 decides for each family."""
    types = hf.get("layer_types")
    window = hf.get("sliding_window") or 0
    if t in ("qwen2_moe", "qwen3_moe") and not hf.get("use_sliding_window", False):
        return 0, None
    if t == "olmoe" or not window:
        return 0, None
    if types is not None:
        chosen = tuple(i for i, kind in enumerate(types) if kind == "sliding_attention")
        return (int(window), chosen) if chosen else (0, None)
    if t == "qwen2_moe":
        # transformers 5: every other layer below max_window_layers slides.
        limit = int(hf.get("max_window_layers", 28))
        chosen = tuple(i for i in range(layers) if (i + 1) % 2 and i < limit)
        return (int(window), chosen) if chosen else (0, None)
    return int(window), None  # Mixtral, Qwen3-MoE: every layer


def _dense_layers(hf: dict[str, Any], t: str, layers: int, experts: int) -> list[int]:
    """Blocks with a dense MLP: Qwen's mlp_only_layers and decoder_sparse_step."""
    if t not in ("qwen2_moe", "qwen3_moe"):
        return []
    only = set(hf.get("mlp_only_layers") or [])
    step = int(hf.get("decoder_sparse_step") or 1)
    return [i for i in range(layers) if i in only or experts <= 0 or (i + 1) % step]


# Weights -----------------------------------------------------------------------------------


def _block_sources(config: LMConfig, model_type: str, index: dict, i: int, hf: dict | None = None) -> dict[str, Any]:
    """Our tensor name (under layers.{i}.) -> how to make it from source tensors: a source
    name, ("experts", [names per expert]) / ("fused", name) for expert stacks, or a Derived."""
    if model_type in FAMILIES:
        return FAMILIES[model_type].block_sources(hf or {"model_type": model_type}, config, index, i)
    src = f"model.layers.{i}."
    out = norms(src)
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        out[f"self_attn.{proj}.weight"] = src + f"self_attn.{proj}.weight"
        out[f"self_attn.{proj}.bias"] = src + f"self_attn.{proj}.bias"
    for norm in ("q_norm", "k_norm"):
        out[f"self_attn.{norm}.weight"] = src + f"self_attn.{norm}.weight"
    out["self_attn.sinks"] = src + "self_attn.sinks"
    if model_type == gpt_oss.MODEL_TYPE:
        out.update(gpt_oss.moe_sources(config, index, src + "mlp."))
        return out
    if config.is_dense(i):
        out.update(dense_mlp(src))
        return out
    moe = src + ("block_sparse_moe." if model_type == "mixtral" and src + "mlp.gate.weight" not in index else "mlp.")
    out["mlp.router.weight"] = moe + "gate.weight"
    # Mixtral's per-expert MLPs call gate, up and down w1, w3 and w2.
    names = ("w1", "w3", "w2") if moe + "experts.0.w1.weight" in index else ("gate_proj", "up_proj", "down_proj")
    out.update(routed_experts(moe, index, config.moe.num_experts, names))
    if config.moe.has_shared_experts:
        out.update(shared_mlp(moe + "shared_expert."))
        out["mlp.shared_experts.gate"] = moe + "shared_expert_gate.weight"
    return out


def _plan(config: LMConfig, model_type: str, index: dict, schema: dict, hf: dict | None = None) -> dict[str, Any]:
    """Our name -> source recipe for every tensor of the schema, checked against the index."""
    plan: dict[str, Any] = {"embed_tokens.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
    if not config.tie_word_embeddings:
        plan["lm_head.weight"] = "lm_head.weight"
    for i in range(config.num_layers):
        plan.update({f"layers.{i}.{k}": v for k, v in _block_sources(config, model_type, index, i, hf).items()})
    plan = {name: plan[name] for name in schema if name in plan}
    lacking = [name for name in schema if name not in plan]
    if lacking:  # a schema tensor no recipe makes: a bug here, not bad input
        raise AssertionError(f"no source for {lacking[0]}")
    used: set[str] = set()
    for name, recipe in plan.items():
        shape = schema[name][0]
        for source, want in _source_shapes(recipe, shape):
            info = index.get(source)
            if info is None:
                raise UsageError(f"the checkpoint lacks {source} (needed for {name}); incomplete or another variant?")
            allowed = next(s.dtypes for s in recipe.sources if s.name == source) if isinstance(recipe, Derived) else ()
            if allowed and info.dtype not in allowed:
                raise UsageError(f"{source} is {info.dtype}; {name} reads it as {' or '.join(allowed)}")
            if not allowed and info.dtype not in ST_DTYPES:
                raise UsageError(f"{source} is {info.dtype}; import float32, float16 or bfloat16 weights")
            if want is not None and info.shape != want:
                raise UsageError(f"{source} has shape {list(info.shape)}, but config.json implies {list(want)}")
            used.add(source)
    ignored = FAMILIES[model_type].ignored(hf or {}) if model_type in FAMILIES else ()
    unused = sorted(
        n for n in index if n not in used and not n.endswith(_IGNORED_SUFFIXES) and not n.startswith(ignored)
    )
    if unused:
        raise UsageError(
            f"the checkpoint has {len(unused)} tensor(s) this import would drop, first {unused[0]} "
            "(a variant of the architecture that deamoe-trt does not implement)"
        )
    return plan


def _source_shapes(recipe: Any, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...] | None]]:
    """(source name, its expected shape) for every source tensor a recipe reads."""
    if isinstance(recipe, str):
        return [(recipe, tuple(shape))]
    if isinstance(recipe, Derived):
        return [(s.name, s.shape) for s in recipe.sources]
    kind, sources = recipe
    if kind == "fused":
        return [(sources, tuple(shape))]
    per = shape[1:] if len(shape) == 3 else shape  # stacked [E, rows, cols] or one shared expert
    if len(sources[0]) == 2:  # gate and up halves of the rows
        half = (per[0] // 2, per[1])
        return [(s, half) for pair in sources for s in pair]
    return [(s, tuple(per)) for (s,) in sources]


def _finite(reader: ShardReader, source: str) -> torch.Tensor:
    """The source tensor, refused by name if it holds NaN or infinity: a damaged model that
    every later command would refuse is better refused here."""
    tensor = reader.get(source)
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        raise UsageError(f"{source} holds NaN or infinite values; the model's weights are damaged")
    return tensor


def _write_tensor(writer: StreamingWriter, reader: ShardReader, name: str, recipe: Any) -> None:
    if isinstance(recipe, Derived):
        writer.begin(name)
        for piece in recipe.make(*(_finite(reader, s.name) for s in recipe.sources)):
            writer.append(piece)
        return
    if isinstance(recipe, str) or recipe[0] == "fused":
        source = recipe if isinstance(recipe, str) else recipe[1]
        writer.write(name, _finite(reader, source))
        return
    writer.begin(name)
    for sources in recipe[1]:  # one expert at a time: [gate rows; up rows] or its down
        for source in sources:
            writer.append(_finite(reader, source))


def import_hf_lm(
    model_dir: str | Path,
    output: str | Path,
    *,
    dtype: torch.dtype | None = None,
    progress: TextIO | None = None,
    force: bool = False,
    note=None,
) -> tuple[LMConfig, dict[str, Any]]:
    """Import the whole model in model_dir as an lm checkpoint in output; see the module docstring.

    The checkpoint is written whole beside output, which it then replaces (_io.replaced_directory):
    no file of an earlier checkpoint stays (an old tokenizer beside a new model's weights), and
    an existing output is replaced only when it is a language-model checkpoint (or with force);
    note(text) hears of a replacement.
    dtype: the checkpoint's dtype; None keeps the stored one (the embedding's).
    Returns the config and a summary {"model_type", "dtype", "tensors", "bytes", "seconds"}.
    """
    from ..lm.checkpoint import FORMAT, FORMAT_VERSION, expected_tensors
    from ..lm.model import DeaMoELM
    from ..lm.tokenizer import hf_tokenizer_from_dir

    model_dir, output = Path(model_dir), Path(output)
    hf = read_config(model_dir)
    config = lm_config(hf, str(model_dir / "config.json"))
    safetensors_files(model_dir)  # refuses pickled-only and weightless directories
    index = index_checkpoint(model_dir)
    embed = index.get("model.embed_tokens.weight")
    if embed is None:
        raise UsageError(f"the checkpoint lacks model.embed_tokens.weight; is {model_dir} a whole model?")
    if dtype is None:
        dtype = ST_DTYPES.get(embed.dtype)
        if dtype not in DTYPES.values():
            raise UsageError(f"model.embed_tokens.weight is {embed.dtype}; pass --dtype fp32, fp16 or bf16")
    tokenizer = hf_tokenizer_from_dir(model_dir, config.vocab_size)

    skeleton = DeaMoELM(config, dtype=dtype, device="meta")
    schema = {name: (tuple(t.shape), t.dtype) for name, t in expected_tensors(skeleton).items()}
    del skeleton
    plan = _plan(config, hf["model_type"], index, schema, hf)

    if output.exists() and not output.is_dir():
        raise UsageError(f"-o {output} exists and is not a directory")
    start = time.perf_counter()
    total = sum(t.numel() * t.itemsize for t in (torch.empty(s, dtype=d, device="meta") for s, d in schema.values()))
    ours = json_format_is(FORMAT)
    check_replaceable(output, ours, "language-model checkpoint", force=force)  # before the work
    work = open_work(
        work_dir(output), _fingerprint(model_dir, hf, dtype, schema), command="import-hf", what="import"
    ).folder
    weights, record = work / WEIGHTS_FILE, work / PROGRESS_FILE
    groups = _groups(plan, config.num_layers)
    # The blocks a killed run wrote whole (their bytes flushed before the record says so).
    done = int(read_json(record).get("blocks", 0)) if record.is_file() and weights.is_file() else 0
    try:
        with weights.open("r+b" if done else "wb") as f:
            writer = StreamingWriter(f, schema)  # the same header again: the schema is the fingerprint's
            for g, (label, names) in enumerate(groups):
                if g < done:
                    writer.skip(names)
                    continue
                reader = ShardReader(index)
                try:
                    for name in names:
                        _write_tensor(writer, reader, name, plan[name])
                finally:
                    reader.close()
                f.flush()
                os.fsync(f.fileno())
                atomic_write_text(record, json.dumps({"blocks": g + 1}) + "\n")
                if progress is not None:
                    rss = peak_rss_bytes() / 2**20
                    progress.write(f"\r  {label:<12} {g + 1}/{len(groups)}  peak RSS {rss:,.0f} MiB")
                    progress.flush()
            writer.close()
    except DeaMoEError:  # bad input: a rerun would stop at the same tensor
        shutil.rmtree(work, ignore_errors=True)
        raise
    if progress is not None:
        progress.write("\n")
    with replaced_directory(output, ours, "language-model checkpoint", force=force, note=note) as staging:
        os.replace(weights, staging / WEIGHTS_FILE)
        tokenizer_meta = tokenizer.save(staging) if tokenizer is not None else {"type": "none"}
        header = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "dtype": dtype_name(dtype),
            "config": config.to_dict(),
            "tokenizer": {**tokenizer_meta, "vocab_size": config.vocab_size},
            "source": {"hf_model_type": hf["model_type"], "hf_dir": str(model_dir.resolve())},
        }
        (staging / CONFIG_FILE).write_text(json.dumps(header, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    summary = {
        "model_type": hf["model_type"],
        "dtype": dtype_name(dtype),
        "tensors": len(schema),
        "bytes": total,
        "seconds": time.perf_counter() - start,
    }
    return config, summary


PROGRESS_FILE = "import.json"  # in OUTPUT.work: how many blocks model.safetensors holds whole


def _fingerprint(model_dir: Path, hf: dict, dtype: torch.dtype, schema: dict) -> str:
    """What the work folder's bytes depend on: the config, the dtype, the tensors written and
    the shards (by name, size and modification time: hashing them would cost a full read)."""
    shards = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in safetensors_files(model_dir)]
    tensors = {name: [list(shape), str(d)] for name, (shape, d) in schema.items()}
    what = {"hf": hf, "dtype": str(dtype), "tensors": tensors, "shards": shards, "dir": str(model_dir.resolve())}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def _groups(plan: dict[str, Any], layers: int) -> list[tuple[str, list[str]]]:
    """The schema's names in write order, grouped by block (shards are released between groups)."""
    groups: list[tuple[str, list[str]]] = []
    for name in plan:
        label = f"layer {name.split('.')[1]}" if name.startswith("layers.") else "embeddings"
        if groups and groups[-1][0] == label:
            groups[-1][1].append(name)
        else:
            groups.append((label, [name]))
    return groups
