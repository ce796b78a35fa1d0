"""`deamoe-trt export-hf`: a language-model checkpoint as a Hugging Face model directory that
transformers loads with `AutoModelForCausalLM.from_pretrained(DIR)` (deamoe-trt installed) or
`from_pretrained(DIR, trust_remote_code=True)` (only transformers and torch installed).

The directory holds:
- config.json: deamoe_trt.hf.fields' keys (model_type "deamoe", the LMConfig under
  "deamoe_lm"), the dtype and auto_map, which names the remote code;
- model-0000i-of-0000n.safetensors shards and model.safetensors.index.json: the tensors under
  their Hugging Face names (the LM checkpoint's behind "model.", the head as lm_head.weight; a
  tied head is stored once, as the embedding) in the checkpoint's dtype, bit for bit;
- the tokenizer (a Hugging Face tokenizer's own files, or for the byte tokenizer a byte-level
  tokenizer.json that splits text into the same ids) and generation_config.json;
- the remote code: the package's own modules (deamoe_trt.hf.remote_code).

Written whole into a temporary folder beside DIR, which then takes its place (no file of an
earlier export stays).
`deamoe-trt import-hf DIR` reads it back (deamoe_trt.importers.families.deamoe).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from .._io import replaced_directory
from ..errors import UsageError
from ..hf.directory import is_model_dir, write_model_files
from ..hf.remote_code import write_remote_code
from ..lm.checkpoint_format import stored_state
from ..lm.model import DeaMoELM
from ..lm.tokenizer import Tokenizer

INDEX_FILE = "model.safetensors.index.json"
DEFAULT_SHARD_BYTES = 2 * 2**30


def hf_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The LM checkpoint's tensor names as the Hugging Face model's."""
    return {(name if name == "lm_head.weight" else "model." + name): t for name, t in state.items()}


def write_hf_dir(
    model: DeaMoELM,
    tokenizer: Tokenizer,
    directory: str | Path,
    *,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    force: bool = False,
    note=None,
) -> Path:
    """Write model and tokenizer as a Hugging Face model directory; see the module docstring.

    The whole directory is written beside it and then takes its place (_io.replaced_directory):
    no shard of an earlier export stays (a model.safetensors beside a new index is what
    transformers would load). It is replaced only when empty or this tool's own, or with force;
    note(text) hears of a replacement."""
    directory = Path(directory)
    config = model.config
    if config.quantization is not None:
        raise UsageError(
            f"export-hf writes floating-point models; this one is quantized (int{config.quantization.bits}): "
            "export the float checkpoint"
        )
    if max_shard_bytes < 1:
        raise UsageError(f"the shard size must be at least 1 byte, got {max_shard_bytes}")
    tensors = {n: t.detach().cpu().contiguous() for n, t in hf_names(stored_state(model.state_dict(), config)).items()}
    shards = _shards(tensors, max_shard_bytes)
    with replaced_directory(directory, is_model_dir, "Hugging Face model directory", force=force, note=note) as staging:
        weight_map = {}
        for i, names in enumerate(shards):
            file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file({n: tensors[n] for n in names}, str(staging / file), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(names, file))
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (staging / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        auto_map = write_remote_code(staging)
        write_model_files(staging, model, tokenizer, auto_map=auto_map)
    return directory


def _shards(tensors: dict[str, torch.Tensor], limit: int) -> list[list[str]]:
    """Names in order, cut into shards of at most limit bytes (a larger tensor alone)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards
