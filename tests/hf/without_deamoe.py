"""Run in a fresh interpreter where deamoe_trt cannot be imported: load each export-hf
directory given with trust_remote_code and write its logits and greedy tokens, or for
`--expect-error` the one line transformers' loading ended in.

python without_deamoe.py OUT_DIR MODEL_DIR... [--expect-error MODEL_DIR]
"""

import importlib.abc
import json
import sys


class NoDeaMoE(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "deamoe_trt" or name.startswith("deamoe_trt."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


sys.meta_path.insert(0, NoDeaMoE())

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

out, *rest = sys.argv[1:]
failing = rest[rest.index("--expect-error") + 1] if "--expect-error" in rest else None
dirs = [d for d in rest if d not in ("--expect-error", failing)]
ids = load_file(f"{out}/prompt.safetensors")["ids"]
for i, directory in enumerate(dirs):
    model = AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True, dtype=torch.float32)
    assert not any(m.startswith("deamoe_trt") for m in sys.modules), "deamoe_trt was imported"
    with torch.no_grad():
        logits = model(ids).logits
        tokens = model.generate(ids, max_new_tokens=32, do_sample=False, attention_mask=torch.ones_like(ids))
    save_file({"logits": logits.contiguous(), "tokens": tokens.contiguous()}, f"{out}/{i}.safetensors")
    print(type(model).__module__)
if failing is not None:
    try:
        AutoModelForCausalLM.from_pretrained(failing, trust_remote_code=True)
        error = None
    except Exception as exc:  # what a user sees
        error = f"{type(exc).__name__}: {exc}"
    with open(f"{out}/error.json", "w") as f:
        json.dump(error, f)
