"""One member of a fault-tolerant training job on a tiny deterministic model (for tests and the
fault-injection benchmark): ``commlayer run --ft -n 4 -m commlayer.testing.ft_member --out DIR ...``.
Each start of a member writes ``DIR/m<member>r<restart>.json``: its status, steps, training time,
the Manager's timings and its final parameters (a start that fails on purpose writes the time to
``DIR/m<member>r<restart>.failed`` instead). A key ``hang/<member>`` in the store makes the
member's first start hang after that step; ``--fail-restarts`` makes every replacement fail.

Every member builds the same model; member ``(replica, shard)`` trains step ``t`` on a batch
seeded by ``(t, replica, shard)``, so a single process can replay the job (:func:`reference`).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as torch_dist

from commlayer.core import settings
from commlayer.core.processes import process_age
from commlayer.ft import FaultToleranceOptions, FaultTolerantDataParallel, JobFinishedError, Manager

__all__ = ["batch", "build_model", "main", "make_optimizer", "reference"]

FEATURES, HIDDEN, OUTPUTS, BATCH = 8, 16, 4, 4


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUTPUTS)
    ).double()


def make_optimizer(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=0.01)


def batch(step: int, replica: int, shard: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step * 1000 + replica * 10 + shard)
    x = torch.randn(BATCH, FEATURES, generator=generator, dtype=torch.float64)
    return x, torch.randn(BATCH, OUTPUTS, generator=generator, dtype=torch.float64)


def loss_of(module: torch.nn.Module, step: int, replica: int, shard: int) -> torch.Tensor:
    device = next(module.parameters()).device
    x, y = batch(step, replica, shard)
    return torch.nn.functional.mse_loss(module(x.to(device)), y.to(device))


def reference(steps: int, shards: int, contributions: Mapping[int, list[int]]) -> torch.Tensor:
    """The flat parameters after ``steps`` steps in one process, step ``t`` averaging the
    gradients of the replicas ``contributions[t]`` (each over its ``shards`` batches)."""
    model = build_model()
    params = list(model.parameters())
    optimizer = make_optimizer(params)
    for step in range(steps):
        replicas = contributions[step]
        optimizer.zero_grad()
        for replica in replicas:
            for shard in range(shards):
                loss = loss_of(model, step, replica, shard) / (len(replicas) * shards)
                loss.backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in params])


def main() -> None:
    args = _parse()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # where a stuck member waits
    restart = int(settings.FT_SLOT_RESTART.value() or 0)
    if args.fail_restarts and restart > 0:
        (Path(args.out) / f"m{os.environ.get('RANK')}r{restart}.failed").write_text(str(time.time()))
        raise SystemExit(f"ft_member: a replacement that cannot start (restart {restart})")
    options = FaultToleranceOptions(
        replicas=args.replicas, shards=args.shards, backend=args.backend, hang_timeout_s=args.hang_timeout
    )
    member = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO, format=f"member {member} %(asctime)s %(message)s")
    replica, shard = options.slot(member)
    cuda_context_s = _start_device(args.device, member, args.shards)
    model = build_model().to(_device(args.device, member, args.shards))
    startup_s = process_age(os.getpid())  # interpreter, imports, CUDA context, model
    manager = Manager(options, sharded=args.stage > 0)
    engine = FaultTolerantDataParallel(model, make_optimizer, manager, stage=args.stage)
    started, status = None, "finished"  # timed from its first step: start-up varies with the load
    ends: list[tuple[int, float]] = []  # (steps applied, when) after each step
    try:
        while engine.step < args.steps:
            engine.train_step(lambda module, step: loss_of(module, step, replica, shard))
            started = started or time.time()
            ends.append((engine.step, time.time()))
            time.sleep(args.step_time)
            manager.store.set(f"progress/{member}", str(engine.step))
            if restart == 0:  # only the member first started in the slot is told to hang
                _maybe_hang(manager.store, member, engine.step)
        manager.finish()
    except JobFinishedError:
        status = "not joined"
    timings = {
        "cuda_context_s": cuda_context_s,
        "startup_s": startup_s,
        "generations": manager.timings,
        "step_ends": ends,
    }
    out = Path(args.out) / f"m{member}r{restart}.json"
    _report(out, engine, manager, status, time.time() - (started or time.time()), timings)
    os._exit(0)


def _start_device(kind: str, member: int, shards: int) -> float | None:
    """Seconds the CUDA context took to create (None on the CPU)."""
    if kind == "cpu":
        return None
    began = time.monotonic()
    _device(kind, member, shards)
    torch.cuda.init()
    torch.empty(1, device="cuda").sum().item()
    return time.monotonic() - began


def _device(kind: str, member: int, shards: int) -> torch.device:
    """The member's device: the CPU, or a GPU that no peer of its communicators shares (NCCL
    allows one rank per GPU in a communicator): one per member where there are enough, else
    ``(replica + shard) % GPUs``, which keeps 2 replicas x 2 shards apart on 2 GPUs."""
    if kind == "cpu":
        return torch.device("cpu")
    if torch.cuda.device_count() == 0:
        raise RuntimeError(
            f"ft_member: argument '--device' expected a machine with a CUDA device, received 'cuda' "
            f"where none is visible (member {member})"
        )
    count = torch.cuda.device_count()
    replica, shard = divmod(member, shards)
    device = torch.device("cuda", member % count if member < count else (replica + shard) % count)
    torch.cuda.set_device(device)
    return device


def _maybe_hang(store: torch_dist.Store, member: int, step: int) -> None:
    """The fault injector asked this member to hang (its loop stops; its heartbeat goes on)."""
    key = f"hang/{member}"
    if store.check([key]) and int(store.get(key)) <= step:
        while True:
            time.sleep(3600)


def _report(
    out: Path,
    engine: FaultTolerantDataParallel,
    manager: Manager,
    status: str,
    seconds: float,
    timings: dict,
) -> None:
    flat = engine.flat[: sum(p.numel() for p in engine.params)]
    summary = {
        "status": status,
        "step": engine.step,
        "seconds": seconds,
        "reconfigurations": manager.reconfigurations,
        "timings": timings,
        "params": flat.cpu().tolist(),
    }
    with open(out, "w") as sink:
        json.dump(summary, sink)


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--stage", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--hang-timeout", type=float, default=3.0)
    parser.add_argument("--out", required=True, help="folder of reports, m<member>r<restart>.json")
    parser.add_argument("--fail-restarts", action="store_true", help="replacements exit at once")
    return parser.parse_args()


if __name__ == "__main__":
    main()
