"""A few SGD steps of DeaMoEForCausalLM under accelerate (DDP over however many processes
`accelerate launch` started), on one global batch split by rank; process 0 writes the trained
weights. python accelerate_train.py MODEL_DIR OUT.safetensors"""

import sys

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

import deamoe_trt  # noqa: F401  (registers the model class)

model_dir, out = sys.argv[1:3]
# Experts no token of a batch chose get no gradient: DDP must not wait for them.
accelerator = Accelerator(cpu=True, kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
model, optimizer = accelerator.prepare(model, optimizer)
data = torch.randint(0, 256, (4, 12), generator=torch.Generator().manual_seed(0))
rank, size = accelerator.process_index, accelerator.num_processes
for _ in range(3):
    batch = data[rank::size]  # equal shares: DDP's mean of the ranks' mean losses is the global mean
    loss = model(input_ids=batch, labels=batch).loss
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
accelerator.wait_for_everyone()
state = accelerator.get_state_dict(model)
if accelerator.is_main_process:
    save_file({k: v.detach().contiguous().clone() for k, v in state.items() if k != "lm_head.weight"}, out)
    print("saved", size)
