"""A peer that never reaches a peermem collective: the waiting rank's call ends in CommTimeoutError.

    torchrun --standalone --nproc-per-node 2 benchmarks/faults/peermem_timeout_gpu.py

The group's timeout is 5 s. Both ranks run one all_reduce; then rank 0 runs a second one that
rank 1 skips (rank 1 sleeps instead). Rank 0's kernel gives up after the timeout, and its next
call raises CommTimeoutError naming rank 1. Prints one line per rank.
"""

from __future__ import annotations

import datetime
import os
import time

import torch

from commlayer import dist
from commlayer.core.errors import CommTimeoutError

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group(timeout=datetime.timedelta(seconds=5))
rank = dist.get_rank()
x = torch.ones(1024, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
outcome = f"first all_reduce -> {x[0].item()}"
if rank == 0:
    dist.all_reduce(x)
    started = time.monotonic()
    torch.cuda.synchronize()
    waited = time.monotonic() - started
    try:
        dist.all_reduce(x)
        outcome += f"; skipped peer: no error after {waited:.1f} s"
    except CommTimeoutError as error:
        outcome += (
            f"; skipped peer: kernel returned after {waited:.1f} s, then {type(error).__name__}: {error}"
        )
else:
    time.sleep(15)  # alive, but never enters the second collective
print(f"rank {rank}: {outcome}", flush=True)
os._exit(0)  # the group is unusable by design; skip the teardown handshake
