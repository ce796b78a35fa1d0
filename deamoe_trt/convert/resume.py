"""Convert's modules as work-folder pieces (deamoe_trt.work_folder): one layer's conversion by
one method, a shared fraction's baselines, one layer's layer-wise healing, each kept in
OUTPUT.work so a killed conversion, rerun with the same arguments, picks up where it was.
End-to-end healing keeps its own checkpoints there (distill.py), unless --heal-checkpoint
names another folder. The command removes the folder once the output is written.
"""

from __future__ import annotations

import torch

from ..config import DeaMoEConfig
from ..layer import DeaMoELayer


def pack_module(module: torch.nn.Module, prefix: str, tensors: dict[str, torch.Tensor]) -> dict:
    """Put module's tensors in tensors under prefix; the description unpack_module rebuilds it from."""
    from .baselines import LowRankDeltaLayer

    tensors.update({prefix + n: t for n, t in module.state_dict().items()})
    config: DeaMoEConfig = module.config  # type: ignore[assignment]  # both kinds carry their routing config
    if isinstance(module, LowRankDeltaLayer):
        return {"kind": "low-rank delta", "config": config.to_dict(), "rank": module.rank}
    if isinstance(module, DeaMoELayer):
        return {"kind": "layer", "config": config.to_dict()}
    raise TypeError(f"no work-folder form for {type(module).__name__}")


def unpack_module(description: dict, prefix: str, tensors: dict[str, torch.Tensor], source: DeaMoELayer):
    """The module pack_module described; source (the layer it was made from) gives the parts
    that are copies of it."""
    import copy

    from .baselines import LowRankDeltaLayer

    config = DeaMoEConfig.from_dict(description["config"])
    if description["kind"] == "low-rank delta":
        delta = LowRankDeltaLayer(config, description["rank"], dtype=source.dtype, router_dtype=source.router_dtype)
        delta.shared_experts = copy.deepcopy(source.shared_experts)
        module: torch.nn.Module = delta
    else:
        module = DeaMoELayer(config, dtype=source.dtype, router_dtype=source.router_dtype)
    state = {n[len(prefix) :]: t for n, t in tensors.items() if n.startswith(prefix)}
    module.load_state_dict(state, assign=True)  # the saved dtypes, healing's included
    return module.eval()
