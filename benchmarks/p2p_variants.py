"""Where async send/recv's added time goes on NCCL: one call shape per variant, timed in rotation.

Issue 14's sweep puts ``dist.isend(t, peer).wait()`` 1.4-1.9 us above torch's on 2 and 4 H100s,
while torch's stand-in ProcessGroup puts the facade at +0.1-0.3 us on the same CPUs, and the
blocking ``dist.send`` (the same C launcher, no Work returned) is faster than torch's. This
script times the variants that separate the candidate causes, every rank running the same
variant at the same time (pairs 0 -> 1, 2 -> 3), rotating the order each round:

* ``issue_us``: CPU time per call of a loop that does not wait for the GPU (NCCL's wait only
  makes the current stream wait), i.e. the host cost of one call;
* ``total_us``: the same loop followed by a device synchronisation, per call.

    python benchmarks/p2p_variants.py --nproc 2 [--pin] [--rounds 21] [--iters 200]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as torch_dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

from torch_vs_commlayer import pin_rank

from commlayer import dist


def variants(tensor: torch.Tensor, sender: bool, peer: int) -> dict[str, Callable[[], object]]:
    pg = torch_dist.group.WORLD
    raw_async = torch_dist.isend if sender else torch_dist.irecv
    raw_sync = torch_dist.send if sender else torch_dist.recv
    ours_async = dist.isend if sender else dist.irecv
    ours_sync = dist.send if sender else dist.recv
    bare = pg.send if sender else pg.recv
    held: list[object] = [None] * 8

    def ours_held() -> None:  # the Work outlives the call by 8 calls: does its release order matter?
        work = ours_async(tensor, peer)
        work.wait()
        held.append(work)
        del held[0]

    ours_async(tensor, peer).wait()  # the plan exists from here on
    plan = _plan("send" if sender else "recv", peer, tensor)
    return {
        "raw_async": lambda: raw_async(tensor, peer).wait(),
        "ours_async": lambda: ours_async(tensor, peer).wait(),
        "raw_sync": lambda: raw_sync(tensor, peer),
        "ours_sync": lambda: ours_sync(tensor, peer),
        "bare_async": lambda: bare([tensor], peer, 0).wait(),
        "ours_torch_wait": lambda: ours_async(tensor, peer).torch_work.wait(),
        "ours_launcher": lambda: plan(True, tensor).wait(),
        "ours_held": ours_held,
    }


def _plan(kind: str, peer: int, tensor: torch.Tensor) -> Callable[..., object]:
    from commlayer.facade.dispatch import plans

    plan = plans[(kind, None, peer, 0, tensor.dtype, tensor.device, tensor.layout)]
    return plan[0] if isinstance(plan, tuple) else plan.run


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(call: Callable[[], object], iters: int) -> tuple[float, float]:
    _synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    issued = time.perf_counter()
    _synchronize()
    done = time.perf_counter()
    return (issued - start) / iters * 1e6, (done - start) / iters * 1e6


def run(options: argparse.Namespace) -> None:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if options.pin:
        pin_rank(local, int(os.environ.get("WORLD_SIZE", "2")))
    cuda = torch.cuda.is_available()  # else gloo on CPU: a smoke test of the script itself
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    sender, peer = rank % 2 == 0, rank + 1 if rank % 2 == 0 else rank - 1
    tensor = torch.ones(2, device="cuda" if cuda else "cpu")
    table = variants(tensor, sender, peer)
    names = list(table)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for name in names:  # warm-up
        timed(table[name], options.iters // 4)
    for index in range(options.rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            if options.no_gc:
                gc.disable()
            results[name].append(timed(table[name], options.iters))
            gc.enable()
    if rank in (0, 1):
        _report(rank, results, options)
    dist.destroy_process_group()


def _report(rank: int, results: dict[str, list[tuple[float, float]]], options: argparse.Namespace) -> None:
    lines = [
        f"# rank {rank} ({'sender' if rank % 2 == 0 else 'receiver'}), {options.rounds} rounds x {options.iters}"
    ]
    lines.append(f"{'variant':26} {'issue_us':>9} {'issue_min':>9} {'total_us':>9} {'total_min':>9}")
    for name, samples in results.items():
        issue = [sample[0] for sample in samples]
        total = [sample[1] for sample in samples]
        lines.append(
            f"{name:26} {statistics.median(issue):9.2f} {min(issue):9.2f} "
            f"{statistics.median(total):9.2f} {min(total):9.2f}"
        )
    print("\n".join(lines), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--pin", action="store_true")
    parser.add_argument("--no-gc", action="store_true", help="disable the cyclic collector while timing")
    options = parser.parse_args()
    if "RANK" in os.environ:
        run(options)
        return
    from commlayer.ports import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(options.nproc))
    torch.multiprocessing.spawn(_spawned, args=(options,), nprocs=options.nproc)


def _spawned(rank: int, options: argparse.Namespace) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
    run(options)


if __name__ == "__main__":
    main()
