"""The first job: written as for torch.distributed, with one import changed.

Run: commlayer run -n 4 examples/first_job.py
"""

import torch

from commlayer import dist  # instead of: import torch.distributed as dist

dist.init_process_group()  # backend from the accelerator, or $COMMLAYER_BACKEND
t = torch.ones(4) * dist.get_rank()
dist.all_reduce(t, op=dist.ReduceOp.SUM)  # same signature, same semantics
work = dist.all_gather_into_tensor(torch.empty(4 * dist.get_world_size()), t, async_op=True)
work.wait()
dist.destroy_process_group()
