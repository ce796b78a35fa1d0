"""A stand-in for a language-model conversion too slow to finish: the source's tensors with
one converted block's FFN (from the unfinished blockwise conversion's work folder,
OUTPUT.work/block-K.safetensors) in every DeaMoE block.

    python scripts/scale_standin.py SOURCE WORK OUTPUT [--block K]

The result has the finished conversion's config, tensor names, shapes and dtypes, so the
steps after convert (quantize, export-lm, generate) cost what they cost on the real
conversion; its outputs are not the real conversion's. Written tensor by tensor.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from safetensors.torch import load_file

from deamoe_trt.checkpoint import DTYPES, write_files_streamed
from deamoe_trt.config import DeaMoEConfig
from deamoe_trt.importers.safetensors_io import ShardReader
from deamoe_trt.lm.checkpoint import expected_tensors
from deamoe_trt.lm.checkpoint_format import checked_index, lm_header, read_lm_header
from deamoe_trt.lm.model import DeaMoELM
from deamoe_trt.lm.tokenizer import HFTokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="the float checkpoint convert was converting")
    parser.add_argument("work", type=Path, help="its work folder (OUTPUT.work)")
    parser.add_argument("output", type=Path)
    parser.add_argument("--block", type=int, default=0, help="the converted block to repeat (default 0)")
    args = parser.parse_args()
    header = read_lm_header(args.source)
    config, dtype, tokenizer = header["config"], DTYPES[header["dtype"]], header["tokenizer"]
    entry = next(b for b in json.loads((args.work / "state.json").read_text())["blocks"] if b["block"] == args.block)
    score = max(entry["agreement"], key=entry["agreement"].get)  # as the conversion chooses it
    converted = config.replace(moe=DeaMoEConfig.from_dict(entry["config"]).replace(department_score=score))
    index = checked_index(args.source, expected_tensors(DeaMoELM(config, dtype=dtype, device="meta")), header["dtype"])
    skeleton = DeaMoELM(converted, dtype=dtype, device="meta")
    schema = {name: (tuple(t.shape), t.dtype) for name, t in expected_tensors(skeleton).items()}
    ffn = load_file(args.work / f"block-{args.block}.safetensors")
    moe = set(skeleton.moe_layers())
    reader = ShardReader(index)

    def tensor(name: str):
        m = re.fullmatch(r"layers\.(\d+)\.mlp\.(.+)", name)
        if m and int(m[1]) in moe:
            return ffn[f"layers.{args.block}.mlp.{m[2]}"]
        return reader.get(name)

    method = f"stand-in: block {args.block}'s converted FFN in every block (scripts/scale_standin.py)"
    training = {"conversion": {"converted_from": str(args.source), "method": method, "department_score": score}}
    if isinstance(tokenizer, HFTokenizer):
        args.output.mkdir(parents=True, exist_ok=True)
        tokenizer.save(args.output)
    try:
        write_files_streamed(args.output, schema, tensor, lm_header(converted, dtype, tokenizer, training))
    finally:
        reader.close()
    print(f"wrote {args.output}: {len(moe)} DeaMoE blocks, each block {args.block}'s converted FFN")


if __name__ == "__main__":
    main()
