"""PEFT LoRA on DeaMoEForCausalLM: the adapters train (the loss falls, only they change) and
merge into a plain model whose logits are the adapted model's."""

from __future__ import annotations

import pytest
import torch

from deamoe_trt.hf.modeling import DeaMoEForCausalLM

from .models import model

peft = pytest.importorskip("peft")
pytestmark = pytest.mark.slow  # transformers and peft load: seconds


def test_lora_on_the_attention_trains_and_merges_into_the_same_logits():
    hf = DeaMoEForCausalLM.from_lm(model("shared_expert_dense_block")).train()
    ids = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = hf(ids).logits.clone()
    frozen = {n: p.detach().clone() for n, p in hf.named_parameters()}
    adapted = peft.get_peft_model(hf, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"]))
    trainable = [n for n, p in adapted.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    opt = torch.optim.AdamW([p for p in adapted.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(8):
        loss = adapted(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1
    adapted.eval()
    with torch.no_grad():
        tuned = adapted(input_ids=ids).logits
    merged = adapted.merge_and_unload()
    assert type(merged) is DeaMoEForCausalLM and not any("lora_" in n for n, _ in merged.named_parameters())
    with torch.no_grad():
        after = merged(ids).logits
    assert torch.allclose(after, tuned, atol=1e-5, rtol=0)
    assert (after - before).abs().max() > 1e-2
    changed = {n for n, p in merged.named_parameters() if not torch.equal(p, frozen[n])}
    assert changed and all(n.endswith(("q_proj.weight", "v_proj.weight", "o_proj.weight")) for n in changed)


# PEFT's target_parameters: the fused [groups, out, in] weights of the departments' shared
# parts and the experts' private parts, and the router's [N, d] weight.
ROUTED = ["router.weight", "departments.gate_up", "departments.down", "experts.gate_up", "experts.down"]


def test_lora_on_the_routers_and_experts_trains_and_merges_into_the_same_logits():
    hf = DeaMoEForCausalLM.from_lm(model("shared_expert_dense_block")).train()
    ids = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = hf(ids).logits.clone()
    frozen = {n: p.detach().clone() for n, p in hf.named_parameters()}
    adapted = peft.get_peft_model(hf, peft.LoraConfig(r=4, lora_alpha=8, target_parameters=ROUTED))
    trainable = [n for n, p in adapted.named_parameters() if p.requires_grad]
    blocks = {n.split(".mlp.")[0] for n in trainable}
    assert trainable and all("lora_" in n for n in trainable) and len(blocks) == 2  # both DeaMoE blocks
    opt = torch.optim.AdamW([p for p in adapted.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(8):
        loss = adapted(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1
    adapted.eval()
    with torch.no_grad():
        tuned = adapted(input_ids=ids).logits
    merged = adapted.merge_and_unload()
    assert type(merged) is DeaMoEForCausalLM and not any("lora_" in n for n, _ in merged.named_parameters())
    with torch.no_grad():
        after = merged(ids).logits
    assert torch.allclose(after, tuned, atol=1e-5, rtol=0)
    assert (after - before).abs().max() > 1e-2
    changed = {n.split(".mlp.")[1] for n, p in merged.named_parameters() if not torch.equal(p, frozen[n])}
    assert changed == set(ROUTED)
