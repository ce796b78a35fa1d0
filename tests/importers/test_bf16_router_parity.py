"""bf16 blocks pick the experts transformers' own bf16 modules pick (spec, "Router precision").

DeepSeek-V3 keeps gate.weight and e_score_correction_bias in float32 inside bf16 models and
routes in float32; Qwen3-MoE routes from bf16 logits. Imported into bf16 DeaMoE layers (the
router keeping Hugging Face's dtypes), every token whose selection has a clear margin picks
the same expert set as the Hugging Face module; the rate over those tokens is printed, with
the rate the old behaviour (router rounded to bf16) gives in the same run as the baseline.
"""

from __future__ import annotations

import pytest
import torch

from deamoe_trt.importers.hf import from_hf

from .hf_util import hf_block, hf_routing, id_sets

TOKENS = 4096
MARGIN = 1e-2  # selection-score gap around the k-th pick (and the g-th group) that counts as clear


def bf16_like_transformers(block: torch.nn.Module) -> torch.nn.Module:
    """block in bf16, with the tensors transformers keeps in float32 kept in float32
    (DeepseekV3PreTrainedModel._keep_in_fp32_modules_strict)."""
    keep = {n: t.detach().clone() for n, t in [*block.named_parameters(), *block.named_buffers()]}
    block = block.to(torch.bfloat16)
    for name, tensor in [*block.named_parameters(), *block.named_buffers()]:
        if name in ("gate.weight", "gate.e_score_correction_bias") and type(block).__name__ == "DeepseekV3MoE":
            tensor.data = keep[name]
    return block


def clear_margin(layer, x: torch.Tensor) -> torch.Tensor:
    """[T] bool: the k-th and (k+1)-th candidates (and the g-th/(g+1)-th groups) differ by MARGIN."""
    c = layer.config
    r = layer.route(x)
    selection = r.scores + (layer.router.bias.float() if layer.router.bias is not None else 0)
    groups = selection.view(len(x), c.num_departments, c.experts_per_department)
    if c.num_departments > 1:
        group_scores = groups.topk(2, dim=-1).values.sum(-1).sort(dim=-1, descending=True).values
        group_gap = group_scores[:, c.top_departments - 1] - group_scores[:, c.top_departments]
    else:
        group_gap = torch.full((len(x),), float("inf"))
    kept = torch.zeros(len(x), c.num_departments, dtype=torch.bool).scatter_(1, r.kept_departments, True)
    candidates = groups.masked_fill(~kept[..., None], -torch.inf).reshape(len(x), -1).sort(-1, descending=True).values
    expert_gap = candidates[:, c.top_k - 1] - candidates[:, c.top_k]
    return (group_gap > MARGIN) & (expert_gap > MARGIN)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["deepseek_v3", "qwen3_moe"])
def test_bf16_block_picks_transformers_experts(family):
    hf = bf16_like_transformers(
        hf_block(family, seed=3, **({"n_routed_experts": 64} if family == "deepseek_v3" else {}))
    )
    layer = from_hf(hf)
    assert layer.dtype == torch.bfloat16
    assert layer.router_dtype == (torch.float32 if family == "deepseek_v3" else torch.bfloat16)
    x = torch.randn(TOKENS, layer.config.hidden_size, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    with torch.no_grad():
        hf_ids, _ = hf_routing(hf, x)
        ours = layer.route(x).expert_ids
        rounded = from_hf(hf)  # the baseline: the router rounded to bf16 as before
        rounded.router.cast_weight(torch.bfloat16)
        if rounded.router.bias is not None:
            rounded.router.bias.data = rounded.router.bias.data.bfloat16().float()
        old = rounded.route(x).expert_ids
    clear = clear_margin(layer, x)
    same = torch.tensor([a == b for a, b in zip(id_sets(ours), id_sets(hf_ids), strict=True)])
    same_old = torch.tensor([a == b for a, b in zip(id_sets(old), id_sets(hf_ids), strict=True)])
    n = int(clear.sum())
    print(
        f"\n{family} bf16: {int(same[clear].sum())}/{n} clear-margin tokens pick transformers' experts "
        f"({same[clear].float().mean():.2%}); all {TOKENS} tokens: {same.float().mean():.2%}; "
        f"baseline router rounded to bf16: {same_old[clear].float().mean():.2%} clear, "
        f"{same_old.float().mean():.2%} all"
    )
    assert n >= 2000
    assert bool(same[clear].all())
    if family == "deepseek_v3":
        # Same float32 router, same float32 routing: every token agrees (the bf16-rounded
        # router of before missed about 1% of them).
        assert bool(same.all())
