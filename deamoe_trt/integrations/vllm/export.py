"""`deamoe-trt export-vllm`: a language-model checkpoint as a Hugging Face-style model directory
that vLLM serves with deamoe-trt's plugin (`vllm serve DIR`, `vllm.LLM(DIR)`).

The directory holds:
- config.json: the Hugging Face keys vLLM reads, "architectures": ["DeaMoEForCausalLM"],
  "model_type": "deamoe", and the whole LMConfig under "deamoe_lm" (hf_fields); quantized,
  also the "quantization_config" that makes vLLM load it with its own quantized methods;
- model.safetensors: the model's tensors under their deamoe-trt checkpoint names and dtype; a
  quantized checkpoint's FFN groups and quantized projections in compressed-tensors'
  pack-quantized format instead (deamoe_trt.integrations.vllm.compressed), its codes re-packed;
- the tokenizer: a Hugging Face tokenizer's own files, or for the byte tokenizer a byte-level
  tokenizer.json (deamoe_trt.lm.tokenizer.byte_level_tokenizer_json) that splits text into
  the same ids;
- a chat template (the tokenizer's, or for the byte tokenizer one that passes the user's
  text through, as `deamoe-trt generate` feeds it) and generation_config.json.

Written whole into a temporary folder beside DIR, which then takes DIR's place
(_io.replaced_directory): a failed export leaves nothing vLLM would load, and no file of an
earlier export (a stale weight shard vLLM would load too) survives. DIR is replaced only when
it is empty or this tool's own vLLM model directory, or with force. No vLLM is needed to write it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from ..._io import replaced_directory
from ...checkpoint import WEIGHTS_FILE
from ...errors import UsageError
from ...hf.directory import is_model_dir, write_model_files
from ...lm.checkpoint import load_lm, read_lm_header, stored_state
from ...lm.config import LMConfig
from ...lm.model import DeaMoELM
from ...lm.tokenizer import NoTokenizer, Tokenizer
from .checks import check_servable
from .compressed import compressed_state, quantization_config

# The byte tokenizer's models continue text: the template passes the messages' text through.
BYTE_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def hf_fields(config: LMConfig) -> dict[str, Any]:
    """The Hugging Face keys vLLM reads for scheduling and KV-cache sizing, and the LMConfig:
    those `export-hf` writes (deamoe_trt.hf.fields).

    No top-level sliding_window: vLLM would apply it to every block; the model class gives
    each block its own window from the LMConfig."""
    from ...hf.fields import hf_fields as fields

    return fields(config)


def write_model_dir(
    checkpoint: str | Path, directory: str | Path, *, twin: str = "deamoe", force: bool = False, note=None
) -> Path:
    """Write the vLLM model directory of the LM checkpoint (or of its expanded or vanilla twin,
    for comparisons); see the module docstring."""
    checkpoint, directory = Path(checkpoint), Path(directory)
    header = read_lm_header(checkpoint)  # refuse a bad config before reading any weights
    check_servable(header["config"])
    check_tokenizer(header["tokenizer"])
    if directory.exists() and directory.resolve() == checkpoint.resolve():
        raise UsageError(f"the vLLM model directory must differ from the checkpoint {checkpoint}")
    loaded = load_lm(checkpoint)
    return write_lm_dir(loaded.model.twin(twin), loaded.tokenizer, directory, force=force, note=note)


def check_tokenizer(tokenizer: Tokenizer) -> None:
    if isinstance(tokenizer, NoTokenizer):
        raise UsageError(
            "this model has no tokenizer, and vLLM needs one; import it again from a Hugging Face directory "
            "with tokenizer.json"
        )


def write_lm_dir(
    model: DeaMoELM, tokenizer: Tokenizer, directory: str | Path, *, force: bool = False, note=None
) -> Path:
    """Write model and tokenizer as a vLLM model directory; see the module docstring. note(text)
    hears of a replaced directory."""
    directory = Path(directory)
    config = model.config
    check_servable(config)
    check_tokenizer(tokenizer)
    with replaced_directory(directory, is_model_dir, "vLLM model directory", force=force, note=note) as staging:
        tensors = {name: t.detach().cpu().contiguous() for name, t in stored_state(model.state_dict(), config).items()}
        if config.quantization is not None:
            tensors = compressed_state(tensors, config)
        save_file(tensors, str(staging / WEIGHTS_FILE), metadata={"format": "pt"})
        extra = {} if config.quantization is None else {"quantization_config": quantization_config(config)}
        write_model_files(staging, model, tokenizer, chat_template=BYTE_CHAT_TEMPLATE, **extra)
    return directory
