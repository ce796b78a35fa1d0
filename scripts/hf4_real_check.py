"""Check the importer against real transformers 4.x MoE blocks (run in a 4.x environment).

    pip install --target /tmp/tf4 --no-deps "transformers==4.57.6" "huggingface_hub<1.0" \
        requests urllib3 idna certifi charset_normalizer "tokenizers>=0.22,<0.23"
    PYTHONPATH=/tmp/tf4:. python scripts/hf4_real_check.py

For each family: the imported layer's outputs and expert choices against the real 4.x
block, and the hf4_layout stand-ins (used by the test suite) against the real block.
DeepSeek-V3 also runs the documented divergence case (negative kept selection score).
Prints one line per check; exits 1 if any fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

# The test suite's helpers (tests/importers/hf_util.py, hf4_layout.py) and the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import transformers
from importers import hf4_layout
from importers.hf_util import TOLERANCE, errors, id_sets, inputs, randomize_

import deamoe_trt


def main() -> int:
    assert transformers.__version__.startswith("4."), transformers.__version__
    from transformers import DeepseekV3Config, MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    d = 32
    cases = {
        "mixtral": (
            MixtralSparseMoeBlock(MixtralConfig(hidden_size=d, intermediate_size=16, num_local_experts=8)),
            hf4_layout.MixtralSparseMoeBlock(d, 16, num_experts=8, top_k=2),
        ),
        "qwen2_moe": (
            Qwen2MoeSparseMoeBlock(
                Qwen2MoeConfig(
                    hidden_size=d,
                    moe_intermediate_size=16,
                    shared_expert_intermediate_size=24,
                    num_experts=8,
                    num_experts_per_tok=2,
                    norm_topk_prob=False,
                )
            ),
            hf4_layout.Qwen2MoeSparseMoeBlock(d, 16, 8, top_k=2, norm_topk_prob=False, shared=24),
        ),
        "qwen3_moe": (
            Qwen3MoeSparseMoeBlock(
                Qwen3MoeConfig(
                    hidden_size=d, moe_intermediate_size=16, num_experts=16, num_experts_per_tok=4, norm_topk_prob=True
                )
            ),
            hf4_layout.Qwen3MoeSparseMoeBlock(d, 16, 16, top_k=4, norm_topk_prob=True),
        ),
        "deepseek_v3": (
            DeepseekV3MoE(
                DeepseekV3Config(
                    hidden_size=d,
                    moe_intermediate_size=16,
                    n_routed_experts=16,
                    n_group=4,
                    topk_group=2,
                    num_experts_per_tok=4,
                    n_shared_experts=2,
                    routed_scaling_factor=2.5,
                    norm_topk_prob=True,
                )
            ),
            hf4_layout.DeepseekV3MoE(d, 16, 16, top_k=4, n_group=4, topk_group=2, n_shared=2),
        ),
    }
    failures = 0
    x = inputs(seed=21)
    with torch.no_grad():
        for family, (real, stand_in) in cases.items():
            randomize_(real, seed=20)
            stand_in.load_state_dict(real.state_dict())
            ref = real(x)
            ref = ref[0] if isinstance(ref, tuple) else ref
            layer = deamoe_trt.from_hf(real)
            ours_abs, ours_rel = errors(layer(x), ref)
            alt = stand_in(x)
            stand_abs, _ = errors(alt[0] if isinstance(alt, tuple) else alt, ref)
            flat = x.reshape(-1, d)
            if family == "deepseek_v3":
                real_ids = real.gate(flat)[0]
            else:
                real_ids = torch.topk(torch.softmax(real.gate(flat).float(), dim=-1), real.top_k, dim=-1).indices
            same_ids = id_sets(layer.route(x).expert_ids) == id_sets(real_ids)
            ok = ours_rel <= TOLERANCE and same_ids and stand_abs <= 1e-6
            failures += not ok
            print(
                f"{'ok  ' if ok else 'FAIL'} {family}: max abs {ours_abs:.3g}, relative {ours_rel:.3g}, "
                f"same experts {same_ids}, stand-in max abs {stand_abs:.3g}"
            )
        # The documented divergence: 4.x masks non-kept groups with 0.0.
        real = randomize_(
            DeepseekV3MoE(
                DeepseekV3Config(
                    hidden_size=d,
                    moe_intermediate_size=16,
                    n_routed_experts=8,
                    n_group=4,
                    topk_group=2,
                    num_experts_per_tok=4,
                    n_shared_experts=1,
                )
            ),
            seed=22,
        )
        real.gate.e_score_correction_bias.copy_(torch.tensor([1.0, 1.0, 1.0, -2.0, -1.5, -1.5, -1.5, -1.5]))
        ours = id_sets(deamoe_trt.from_hf(real).route(x).expert_ids)
        theirs = id_sets(real.gate(x.reshape(-1, d))[0])
        diverges = all(o == {0, 1, 2, 3} for o in ours) and all(3 not in t for t in theirs)
        failures += not diverges
        print(f"{'ok  ' if diverges else 'FAIL'} deepseek_v3 4.x 0.0-mask divergence reproduced: {diverges}")
    print(f"transformers {transformers.__version__}: {'all ok' if not failures else f'{failures} failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
