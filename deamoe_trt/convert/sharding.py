"""Fully sharded data parallelism (FSDP) for healing and training.

The blocks being trained run as copies wrapped by torch's FSDP2 (`fully_shard`, what
accelerate's FSDP runs on GPUs): each process holds 1/R of their parameters, gradients and
Adam state, gathers a block's parameters for its forward and backward, and reduce-scatters
its gradients as a sum, so the losses of distill.py and train/lm.py (each process's summed
over its tokens and divided by the global batch's token count) give the one-process
gradient, as sum_across_ranks does for the unsharded runs. accelerate itself runs CPU
processes as DDP even when launched with --use_fsdp; torch's FSDP2 runs on gloo, so the
same script shards on CPU processes and GPUs alike. On leaving, the trained values are
gathered back into the original modules on every process, which stay plain modules that
save as any other.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeGuard

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor


def fsdp_requested(flag: bool) -> bool:
    """The --fsdp flag, or a job started with `accelerate launch --use_fsdp`."""
    return flag or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def is_sharded(tensor: torch.Tensor) -> TypeGuard[DTensor]:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a shard (a collective: every process calls it), or the tensor."""
    return tensor.full_tensor() if is_sharded(tensor) else tensor


def like(param: torch.Tensor, whole: torch.Tensor) -> torch.Tensor:
    """whole, as param holds it: this process's shard where param is sharded."""
    if is_sharded(param):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(whole.to(param.device), param.device_mesh, param.placements)
    return whole.to(param.device).clone()


@contextmanager
def sharded(owner: nn.Module, names: Sequence[str], *, root: bool = False) -> Iterator[nn.Module]:
    """Swap owner's submodules `names` (dotted paths, e.g. "layers.3") for FSDP-sharded copies
    (and, with root, shard owner's remaining parameters too, in place of a copy of owner);
    yield the module to train. On exit every process gathers the trained values back into
    the original modules and puts them back."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    work = copy.deepcopy(owner) if root else owner
    originals = {name: owner.get_submodule(name) for name in names}
    units: list[FSDPModule] = []
    for name in names:
        part = work.get_submodule(name) if root else copy.deepcopy(originals[name])
        units.append(fully_shard(part, reshard_after_forward=True))
        if not root:
            _set(owner, name, part)
    if root:
        units.append(fully_shard(work))
    for unit in units:
        unit.set_gradient_divide_factor(1.0)  # sum the processes' gradients, as sum_across_ranks does
        unit.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
    try:
        yield work
    except BaseException:
        # No gathering (a collective another process may never join): the originals come
        # back untrained.
        for name, module in originals.items():
            _set(owner, name, module)
        raise
    state = {k: full(v).detach() for k, v in work.state_dict().items()}
    if root:
        owner.load_state_dict(state)
    for name, module in originals.items():
        if not root:
            prefix = name + "."
            module.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})
        _set(owner, name, module)


def _set(owner: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(owner.get_submodule(parent) if parent else owner, leaf, module)
