"""A language model as an ONNX Runtime GenAI model folder (`onnxruntime_genai.Model(folder)`).

The folder holds the whole-LM graph of deamoe_trt.export.lm with two inputs GenAI
feeds (model.onnx), a genai_config.json that maps GenAI's decoder inputs and outputs onto
the graph's names, and the tokenizer files GenAI's tokenizer reads:

- a Hugging Face tokenizer travels as its own tokenizer.json / tokenizer_config.json;
- the byte tokenizer becomes a byte-level BPE tokenizer.json with no merges (GPT-2's
  byte-to-character table, token id = byte value), so GenAI and the `tokenizers` library
  split text into the same ids as deamoe_trt.lm.tokenizer.ByteTokenizer.

GenAI batches prompts of different lengths by padding them and masking the padding, so the
graph gains attention_mask [batch, past + tokens] (0 at padding) and position_ids
[batch, tokens]: rotary embeddings read position_ids instead of past .. past + tokens - 1,
and each attention's causal mask also hides the keys whose attention_mask is 0. Everything
else, weights included, is the graph `export-lm` writes.

The byte tokenizer has no end-of-text token; the config names byte 0 (NUL, never in the
alphabet) as eos so generation runs to max_length, as `deamoe-trt generate` does.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..._io import replaced_directory
from ...errors import MissingDependencyError, UsageError
from ...export.lm import INPUT_IDS, LOGITS, build_lm_model
from ...export.save import save_model
from ...lm.model import DeaMoELM
from ...lm.tokenizer import (
    HFTokenizer,
    NoTokenizer,
    Tokenizer,
    byte_level_tokenizer_json,
    default_tokenizer,
)
from ...versions import check_tested

MODEL_FILE = "model.onnx"
CONFIG_FILE = "genai_config.json"
# onnxruntime-genai releases whose config schema and decoder I/O this export was checked against.
TESTED_VERSIONS = ((0, 18), (0, 18))
FORMS = ("ort", "onnx")  # the plugin form needs TensorRT's DeaMoE plugin, which GenAI's sessions lack
DTYPES = ("fp32", "fp16")
BYTE_EOS = 0
ATTENTION_MASK, POSITION_IDS = "attention_mask", "position_ids"
LOG_ID = "deamoe-trt"  # the sessions' log id, and the mark of a folder this module wrote


def check_genai_version(version: str) -> None:
    """A UsageError unless version (onnxruntime_genai.__version__) is in TESTED_VERSIONS."""
    install = "pip install 'onnxruntime-genai>=0.18,<0.19'"
    check_tested(version, TESTED_VERSIONS, "onnxruntime-genai", "deamoe-trt's GenAI folders", install)


def load_genai(folder: str | Path):
    """onnxruntime_genai.Model(folder), after checking the installed GenAI's version."""
    try:
        import onnxruntime_genai as og
    except ImportError:
        raise MissingDependencyError(
            "running a GenAI folder needs onnxruntime-genai: pip install 'onnxruntime-genai>=0.18,<0.19'"
        ) from None
    check_genai_version(og.__version__)
    return og.Model(str(folder))


def genai_config(model: DeaMoELM, *, eos_ids: list[int], bos_id: int, pad_id: int) -> dict:
    c = model.config
    return {
        "model": {
            "type": "llama",
            "bos_token_id": bos_id,
            "eos_token_id": eos_ids if len(eos_ids) > 1 else eos_ids[0],
            "pad_token_id": pad_id,
            "context_length": c.max_position_embeddings,
            "vocab_size": c.vocab_size,
            "decoder": {
                "filename": MODEL_FILE,
                "session_options": {"log_id": LOG_ID, "provider_options": []},
                "head_size": c.head_dim,
                "hidden_size": c.hidden_size,
                "num_attention_heads": c.num_heads,
                "num_key_value_heads": c.num_key_value_heads,
                "num_hidden_layers": c.num_layers,
                "inputs": {
                    "input_ids": INPUT_IDS,
                    "attention_mask": ATTENTION_MASK,
                    "position_ids": POSITION_IDS,
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": LOGITS,
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
            },
        },
        "search": {
            "do_sample": False,
            "num_beams": 1,
            "num_return_sequences": 1,
            "max_length": c.max_position_embeddings,
            "min_length": 0,
            "past_present_share_buffer": False,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
        },
    }


def check_genai_model(model: DeaMoELM, form: str, dtype: str, tokenizer: Tokenizer) -> None:
    """A UsageError naming what GenAI cannot run: the plugin form, dtypes other than fp32/fp16."""
    if form not in FORMS:
        raise UsageError(
            f"--target genai writes the ort or onnx form, not {form!r}: GenAI runs on ONNX Runtime, which has no "
            "TensorRT DeaMoE plugin; use --form ort"
        )
    if dtype not in DTYPES:
        raise UsageError(f"--target genai writes fp32 or fp16, not {dtype}")
    if isinstance(tokenizer, NoTokenizer):
        raise UsageError(
            "this model has no tokenizer, and a GenAI folder needs one; import it again from a Hugging Face "
            "directory with tokenizer.json"
        )


def is_genai_folder(folder: Path) -> bool:
    """A folder this module wrote: its genai_config.json names deamoe-trt as the session's log id."""
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
        return config["model"]["decoder"]["session_options"]["log_id"] == LOG_ID
    except (OSError, ValueError, TypeError, KeyError):
        return False


def export_genai(
    model: DeaMoELM,
    folder: str | Path,
    form: str = "ort",
    dtype: str = "fp32",
    opset: int | None = None,
    *,
    tokenizer: Tokenizer | None = None,
    twin: str = "deamoe",
    force: bool = False,
    note=None,
) -> Path:
    """Write the GenAI model folder (see the module docstring); returns folder.

    The whole folder is written to a temporary folder beside it, which then takes its place
    (_io.replaced_directory): a failed export leaves no folder GenAI would load, and no file of
    an earlier export stays. An existing folder is replaced only when empty or this module's
    own (or with force); note(text) hears of a replacement.
    """
    folder = Path(folder)
    tokenizer = tokenizer or default_tokenizer(model.config.vocab_size)
    check_genai_model(model, form, dtype, tokenizer)
    with replaced_directory(folder, is_genai_folder, "GenAI folder", force=force, note=note) as staging:
        proto = build_lm_model(model, form, dtype, opset, tokenizer=tokenizer, twin=twin)
        add_padding_inputs(proto)
        save_model(proto, staging / MODEL_FILE)
        if isinstance(tokenizer, HFTokenizer):
            tokenizer.save(staging)
            eos_ids = tokenizer.eos_ids() or [BYTE_EOS]
            bos = tokenizer.tokenizer.token_to_id(_special(tokenizer, "bos_token") or "")
            pad = tokenizer.tokenizer.token_to_id(_special(tokenizer, "pad_token") or "")
            bos_id, pad_id = (bos if bos is not None else eos_ids[0]), (pad if pad is not None else eos_ids[0])
        else:
            (staging / "tokenizer.json").write_text(json.dumps(byte_level_tokenizer_json(tokenizer)))
            (staging / "tokenizer_config.json").write_text(
                json.dumps({"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False, "model_max_length": 10**6})
            )
            eos_ids, bos_id, pad_id = [BYTE_EOS], BYTE_EOS, BYTE_EOS
        config = genai_config(model, eos_ids=eos_ids, bos_id=bos_id, pad_id=pad_id)
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return folder


def add_padding_inputs(proto: onnx.ModelProto) -> None:
    """Give the whole-LM graph GenAI's attention_mask and position_ids inputs (in place).

    The rotary tables are gathered at position_ids ([B, T, half], broadcast over heads) and
    every attention's mask (the input of the Where that feeds its Softmax) is or-ed with
    attention_mask == 0 over the key axis ([B, 1, 1, 1, S] against scores [B, kvh, g, T, S]).
    """
    graph = proto.graph
    consumers: dict[str, list[str]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node.op_type)
    graph.input.extend(
        [
            helper.make_tensor_value_info(ATTENTION_MASK, TensorProto.INT64, ["batch", "total"]),
            helper.make_tensor_value_info(POSITION_IDS, TensorProto.INT64, ["batch", "tokens"]),
        ]
    )
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([1], np.int64), "genai.heads_axis"),
            numpy_helper.from_array(np.array([1, 2, 3], np.int64), "genai.mask_axes"),
            numpy_helper.from_array(np.array(0, np.int64), "genai.zero"),
        ]
    )
    padding = [
        helper.make_node("Equal", [ATTENTION_MASK, "genai.zero"], ["genai.padding"], name="genai.padding"),
        helper.make_node("Unsqueeze", ["genai.padding", "genai.mask_axes"], ["genai.padding5"], name="genai.padding5"),
    ]
    nodes, masks, tables = [], {}, 0
    for node in graph.node:
        if node.op_type == "Gather" and node.input[0] in ("rope.cos", "rope.sin"):
            out = node.output[0]
            node.input[1], node.output[0] = POSITION_IDS, out + ".per_row"
            nodes += [node, helper.make_node("Unsqueeze", [out + ".per_row", "genai.heads_axis"], [out])]
            tables += 1
            continue
        attention = node.name.startswith("layers.") and ".mlp." not in node.name  # not a router's softmax
        if node.op_type == "Where" and attention and consumers.get(node.output[0]) == ["Softmax"]:
            mask = node.input[0]
            if mask not in masks:
                masks[mask] = mask + ".padded"
                nodes.append(helper.make_node("Or", [mask, "genai.padding5"], [masks[mask]]))
            node.input[0] = masks[mask]
        nodes.append(node)
    if tables != 2 or not masks:  # the graph's layout changed: fail here rather than decode wrongly
        raise UsageError(
            f"the language-model graph has {tables} rotary tables and {len(masks)} attention masks where GenAI's "
            "padding inputs expect 2 and at least 1; this deamoe-trt cannot write GenAI folders for it"
        )
    del graph.node[:]
    graph.node.extend(padding + nodes)


def _special(tokenizer: HFTokenizer, key: str) -> str | None:
    token = tokenizer.settings.get(key)
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None
