"""The torchft 0.2 baseline: the fault-injection job's model and batches under torchft's DDP on gloo.

Four replica groups of one rank each (torchft's DDP replicates only) train through a lighthouse;
one replica SIGKILLs itself at ``--kill-step`` and a replacement starts at once and recovers the
state live from a peer. The time lost to the failure is the slowest survivor's training time
minus that of a fault-free run (``--kill-step -1``), both from this script's report::

    python benchmarks/faults/torchft_baseline.py --kill-step 7
    python benchmarks/faults/torchft_baseline.py --kill-step -1
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import torch.distributed as dist

REPLICAS = 4


def replica_main(args: argparse.Namespace) -> None:
    from torchft import DistributedDataParallel, Manager, Optimizer
    from torchft.process_group import ProcessGroupGloo

    from commlayer.testing.ft_member import build_model, loss_of, make_optimizer

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    model = build_model()
    inner = make_optimizer(list(model.parameters()))

    def load_state_dict(state: dict) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optimizer"])

    manager = Manager(
        pg=ProcessGroupGloo(),
        load_state_dict=load_state_dict,
        state_dict=lambda: {"model": model.state_dict(), "optimizer": inner.state_dict()},
        min_replica_size=1,
        replica_id=f"replica{args.replica}",
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=args.lighthouse,
        timeout=timedelta(seconds=10),
    )
    ddp, optimizer = DistributedDataParallel(manager, model), Optimizer(manager, inner)
    started = time.time()
    while manager.current_step() < args.steps:
        step = manager.current_step()
        if args.replica == REPLICAS - 1 and step == args.kill_step and not args.replacement:
            os.kill(os.getpid(), signal.SIGKILL)
        optimizer.zero_grad()
        loss_of(ddp, step, args.replica // 2, args.replica % 2).backward()
        optimizer.step()
        time.sleep(args.step_time)
    print(f"replica {args.replica} trained {args.steps} steps in {time.time() - started:.3f}s", flush=True)
    os._exit(0)


def main() -> None:
    args = _parse()
    if args.replica >= 0:
        replica_main(args)
        return
    port = 29610
    lighthouse = subprocess.Popen(
        [
            "torchft_lighthouse",
            "--min_replicas",
            "1",
            "--join_timeout_ms",
            "100",
            "--bind",
            f"127.0.0.1:{port}",
        ]
    )
    common = [
        "--steps",
        str(args.steps),
        "--step-time",
        str(args.step_time),
        "--kill-step",
        str(args.kill_step),
    ]
    common += ["--lighthouse", f"http://127.0.0.1:{port}"]
    spawn = lambda r, extra=(): subprocess.Popen(
        [sys.executable, __file__, "--replica", str(r), *common, *extra], stdout=subprocess.PIPE, text=True
    )
    replicas = [spawn(r) for r in range(REPLICAS)]
    if args.kill_step >= 0:
        replicas[-1].wait()
        replicas.append(spawn(REPLICAS - 1, ["--replacement"]))
    for process in replicas:
        out, _ = process.communicate(timeout=600)
        print(out.strip())
    lighthouse.kill()


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-time", type=float, default=0.2)
    parser.add_argument("--kill-step", type=int, default=7)
    parser.add_argument("--replica", type=int, default=-1)
    parser.add_argument("--replacement", action="store_true")
    parser.add_argument("--lighthouse", default="")
    return parser.parse_args()


if __name__ == "__main__":
    main()
