"""torchtitan's trainer on a process group this script starts: ``BACKEND`` then torchtitan's arguments.

    torchrun --standalone --nproc-per-node 2 benchmarks/gpu/torchtitan_run.py commlayer \\
        --module llama3 --config llama3_debugmodel --training.steps 30

torchtitan 0.3.0 passes ``init_process_group`` an argument (``_ranks``) that released torch builds
lack, and skips its own call when a process group exists; so the group is started here, on
``commlayer`` (the default CUDA backend) or on what torchtitan itself asks for
(``cuda:nccl,cpu:gloo``), and torchtitan's own ``main`` runs on it unchanged.
"""

from __future__ import annotations

import os
import runpy
import sys

import torch
import torch.distributed as dist

TORCHTITAN_OWN = "cuda:nccl,cpu:gloo"


def main() -> None:
    backend, arguments = sys.argv[1], sys.argv[2:]
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(TORCHTITAN_OWN if backend == "nccl" else backend)
    if dist.get_rank() == 0:
        print(f"process group: {dist.get_backend()}", flush=True)
    sys.argv = ["torchtitan.train", *arguments]
    runpy.run_module("torchtitan.train", run_name="__main__")


if __name__ == "__main__":
    main()
