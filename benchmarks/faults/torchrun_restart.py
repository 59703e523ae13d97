"""The restart baseline: the fault-injection job under ``torchrun --max-restarts``.

Four gloo ranks train the same model on the same batches as ``commlayer.testing.ft_member``
(2 replicas x 2 shards, i.e. 4 data-parallel ranks), rank 0 checkpoints every ``--every`` steps,
and one rank SIGKILLs itself at ``--kill-step`` on the first attempt: torchrun restarts the whole
world, which reloads the last checkpoint and redoes the steps since. Run it with and without the
kill; the time lost to the failure is when the restarted world finishes the killed step, minus
when the first attempt finished the step before, minus one step (``--timeline`` records them)::

    python -m torch.distributed.run --nproc-per-node 4 --max-restarts 1 benchmarks/faults/torchrun_restart.py --kill-step 7
    python -m torch.distributed.run --nproc-per-node 4 --max-restarts 1 benchmarks/faults/torchrun_restart.py --kill-step -1
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

from commlayer.testing.ft_member import build_model, loss_of, make_optimizer


def main() -> None:
    args = _parse()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # A fresh key space per attempt: the agent's store keeps the dead attempt's gloo addresses.
    agent_store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    store = dist.PrefixStore(f"restart_baseline/attempt{attempt}", agent_store)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    model, checkpoint = build_model(), Path(args.checkpoint)
    optimizer = make_optimizer(list(model.parameters()))
    start = 0
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    for step in range(start, args.steps):
        if attempt == 0 and step == args.kill_step and rank == world - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        optimizer.zero_grad()
        loss_of(model, step, rank // 2, rank % 2).backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= world
        optimizer.step()
        time.sleep(args.step_time)
        if rank == 0 and (step + 1) % args.every == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1}
            torch.save(state, checkpoint.with_suffix(".tmp"))
            os.replace(checkpoint.with_suffix(".tmp"), checkpoint)
        dist.barrier()
        if rank == 0 and args.timeline:
            with open(args.timeline, "a") as timeline:
                timeline.write(f"{attempt} {step} {time.time():.3f}\n")
    dist.destroy_process_group()


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--step-time", type=float, default=0.2)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--kill-step", type=int, default=7)
    parser.add_argument("--checkpoint", default="/tmp/restart_baseline.pt")
    parser.add_argument("--timeline", default="", help="rank 0 appends 'attempt step time' per step")
    return parser.parse_args()


if __name__ == "__main__":
    main()
