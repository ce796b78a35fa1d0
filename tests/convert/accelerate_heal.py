"""Healing on however many processes `accelerate launch` (or torchrun) started: the models
and windows of test_distill.py; process 0 writes the healed FFNs and the losses.
python accelerate_heal.py OUT.safetensors [--checkpoint C] [--stop-after N] [--fsdp]
--stop-after N: every process stops (exit 3) after N steps, as a killed job would."""

import argparse

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from convert.test_distill import models, trained, windows
from deamoe_trt.convert.distill import DistillSettings, distill_lm, init_distributed
from deamoe_trt.convert.sharding import fsdp_requested

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--checkpoint")
parser.add_argument("--stop-after", type=int, default=0)
parser.add_argument("--fsdp", action="store_true")
args = parser.parse_args()


class StopAfter:
    def __init__(self, steps: int):
        self.left = steps

    def update(self, message: str = "", step: int = 1) -> None:
        self.left -= step
        if self.left <= 0:
            raise SystemExit(3)


torch.set_num_threads(1)
rank, size = init_distributed("cpu")
settings = DistillSettings(
    steps=6, lr=3e-3, batch_size=6, seed=2, checkpoint=args.checkpoint, checkpoint_every=2,
    fsdp=fsdp_requested(args.fsdp),
)  # fmt: skip
source, student = models()
stop = StopAfter(args.stop_after) if args.stop_after else None
losses = distill_lm(student, source, windows(), settings, progress=stop)
if rank == 0:
    tensors = trained(student)
    tensors["losses"] = torch.tensor(losses)
    save_file({k: v.contiguous() for k, v in tensors.items()}, args.out)
if size > 1:
    from accelerate import PartialState

    print(f"healed on {size} processes, {PartialState().distributed_type.value}, fsdp {settings.fsdp}")
    dist.barrier()  # both ranks leave together (gloo can abort a peer still working)
    dist.destroy_process_group()
