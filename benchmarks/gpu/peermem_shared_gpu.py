"""peermem's kernels checked by ranks that share one GPU, where no machine with more is at hand.

    torchrun --standalone --nproc-per-node N benchmarks/gpu/peermem_shared_gpu.py --out DIR \
        [--anchor anchors/zero_anchor.py]

CUDA maps one process's memory into another process on the same GPU as it does across GPUs, so
the kernels, the C fast path, the group's stream with its pooled events and the zero-copy
registration run here as they do on two GPUs; the two processes' kernels take turns on the device
instead of running side by side, so nothing is timed. Such a world needs two changes, made in this
script only: the attach's refusal of ranks on one GPU is lifted, and since NCCL refuses two ranks
on one GPU outright, only calls the kernels serve are made: a check of ``peermem_checks.py`` whose
call NCCL would serve is counted as left out, and ZeRO's broadcasts at set-up are done as sums.

Then (with ``--anchor``) ZeRO stages 2 and 3 train the anchor's GPT, small, for a few steps: with
the large asynchronous calls on the group's stream (the default), on the caller's stream, and
(stage 3) with the blocks gathered in pairs (``stage3_coalesce_numel``). Every run must end
bitwise where the first did, loss by loss and parameter by parameter, and the ranks must agree
bitwise on the parameters. Each rank writes ``DIR/shared_gpu_w{WORLD}_rank{R}.json`` and prints
its summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from peermem_checks import STAGES, Checks, run_all

import commlayer.dist as facade
from commlayer import dist
from commlayer.backends.peermem import attach
from commlayer.core.types import ReduceOp


class KernelChecks(Checks):
    """The checks, less every call NCCL would serve (counted in ``left_out``)."""

    def __init__(self, comm: Any, rank: int, world: int, device: torch.device) -> None:
        super().__init__(comm, rank, world, device)
        self.left_out = 0

    def _kernels_serve(self, op: str, nbytes: int, dtype: torch.dtype, reduce_op: ReduceOp | None) -> bool:
        if self.served(op, nbytes, dtype, reduce_op):
            return True
        self.left_out += 1
        return False

    def all_reduce(self, numel: int, dtype: torch.dtype, op: ReduceOp, label: str, offset: int = 0) -> None:
        if self._kernels_serve("all_reduce", numel * dtype.itemsize, dtype, op):
            super().all_reduce(numel, dtype, op, label, offset)

    def all_gather(self, numel: int, dtype: torch.dtype, label: str, offset: int = 0) -> None:
        nbytes = self.world * numel * dtype.itemsize
        if self._kernels_serve("all_gather_into_tensor", nbytes, dtype, None):
            super().all_gather(numel, dtype, label, offset)

    def reduce_scatter(self, numel: int, dtype: torch.dtype, op: ReduceOp, label: str) -> None:
        if self._kernels_serve("reduce_scatter_tensor", self.world * numel * dtype.itemsize, dtype, op):
            super().reduce_scatter(numel, dtype, op, label)

    def all_to_all(self, rows: list[list[int]], width: int, dtype: torch.dtype, label: str) -> None:
        if self.comm.serves_all_to_all():
            super().all_to_all(rows, width, dtype, label)
        else:
            self.left_out += 1


def broadcast_as_sum(comm: Any) -> Callable[..., Any]:
    """``dist.broadcast`` for this world: the non-source ranks contribute zeros to a kernel sum."""

    def broadcast(tensor: torch.Tensor, src: int, group: Any = None, async_op: bool = False) -> Any:
        nbytes = tensor.numel() * tensor.element_size()
        if comm.route("all_reduce", nbytes, tensor.dtype, ReduceOp.SUM) is None:
            raise RuntimeError(f"broadcast of {tuple(tensor.shape)} {tensor.dtype}: NCCL would serve it")
        if dist.get_rank() != src:
            tensor.zero_()
        return dist.all_reduce(tensor, group=group, async_op=async_op)

    return broadcast


#: Elements of two of the small GPT's blocks (12 w^2 + 13 w each, w = 256): joined in pairs.
TWO_BLOCKS = 2 * (12 * 256 * 256 + 13 * 256)


def train(anchor: Any, stage: int, device: torch.device, steps: int, coalesce: int = 0) -> dict[str, Any]:
    from commlayer import zero  # needs pydantic, which the checks above do without

    torch.manual_seed(0)
    model = anchor.GPT(1024, 256, 4, 4, 128).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sharding = {"stage": stage, "overlap_comm": True, "reduce_bucket_size": 1 << 20}
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "bf16": {"enabled": True},
        "zero_optimization": {**sharding, "stage3_coalesce_numel": coalesce},
    }
    engine = zero.initialize(model=model, optimizer=optimizer, config=config)
    generator = torch.Generator(device=device).manual_seed(dist.get_rank())
    losses = []
    for _ in range(steps):
        x = torch.randint(0, 1024, (2, 128), device=device, generator=generator)
        y = torch.randint(0, 1024, (2, 128), device=device, generator=generator)
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.float().item())
    state = {name: value.float().cpu() for name, value in engine.full_state_dict().items()}
    engine.destroy()
    return {"losses": losses, "state": state}


def zero_runs(anchor_path: Path, stage: int, comm: Any, device: torch.device) -> dict[str, Any]:
    """``stage`` with the large asynchronous calls on the group's stream, then on the caller's,
    and (stage 3) with the blocks gathered in pairs: each must end bitwise where the first did."""
    from zero import load_anchor  # benchmarks/gpu/zero.py, which imports commlayer.zero

    anchor = load_anchor(anchor_path)
    facade.broadcast = broadcast_as_sum(comm)
    default_bytes = comm.async_bytes
    variants = {"group_stream": (default_bytes, 0), "caller_stream": (-1, 0)}
    if stage == 3:
        variants["blocks_in_pairs"] = (default_bytes, TWO_BLOCKS)
    runs = {}
    for name, (async_bytes, coalesce) in variants.items():
        comm.async_bytes = async_bytes
        runs[name] = train(anchor, stage, device, steps=6, coalesce=coalesce)
    comm.async_bytes = default_bytes
    first = runs["group_stream"]
    report: dict[str, Any] = {"losses": first["losses"], "parameters": len(first["state"])}
    report["parameter_digest"] = sum(float(v.double().abs().sum()) for v in first["state"].values())
    for name, run in list(runs.items())[1:]:
        differing = [
            key for key, value in first["state"].items() if not torch.equal(value, run["state"][key])
        ]
        report[name] = {
            "losses_equal": run["losses"] == first["losses"],
            "parameters_differing": differing[:10],
        }
    return report


def summary_line(report: dict[str, Any]) -> str:
    """One line per rank for the run's summary: the checks, and whether each ZeRO pair agreed."""
    checks = report.get("checks", {})
    line = (
        f"shared: world {report['world']} rank {report['rank']}: {checks.get('passed')} checks passed, "
        f"{report['checks_left_out']} left out, failures {checks.get('failures')}"
    )
    for stage in (2, 3):
        run = report.get(f"zero_stage{stage}")
        if run is not None:
            variants = {key: value for key, value in run.items() if isinstance(value, dict)}
            agreed = [
                f"{key} {v['losses_equal'] and not v['parameters_differing']}" for key, v in variants.items()
            ]
            line += f"; ZeRO {stage} digest {run['parameter_digest']:.6f}, bitwise equal: {', '.join(agreed)}"
    errors = [report[key].strip().splitlines()[-1] for key in ("checks_error", "zero_error") if key in report]
    return line + "".join(f"; ERROR {error}" for error in errors)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--stages", default=",".join(STAGES), help="check stages to run (comma-separated)")
    parser.add_argument(
        "--anchor", type=Path, default=None, help="zero_anchor.py: also train with ZeRO stages 2 and 3"
    )
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    attach.duplicate_devices = lambda devices: ""  # this world's ranks share the GPU on purpose
    torch.cuda.set_device(0)
    device = torch.device("cuda", 0)
    began = time.time()
    dist.init_process_group(timeout=timedelta(seconds=120))
    backend = dist.group.WORLD.backend_for("cuda")
    comm = backend.peer_comm
    report: dict[str, Any] = {
        "rank": rank,
        "world": dist.get_world_size(),
        "serves_locally": comm is not None,
    }
    report.update(device=torch.cuda.get_device_name(), torch=torch.__version__)
    report["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if comm is None:
        raise SystemExit("peermem does not serve this world: nothing to check")
    checks = KernelChecks(comm, rank, dist.get_world_size(), device)
    try:
        report["checks"] = run_all(checks, backend, tuple(filter(None, args.stages.split(","))))
    except Exception:  # noqa: BLE001 - reported with what ran before it
        report["checks_error"] = traceback.format_exc()[-3000:]
    report["checks_left_out"] = checks.left_out
    if args.anchor is not None and "checks_error" not in report:
        try:
            for stage in (2, 3):
                report[f"zero_stage{stage}"] = zero_runs(args.anchor, stage, comm, device)
        except Exception:  # noqa: BLE001 - reported with the checks' results
            report["zero_error"] = traceback.format_exc()[-3000:]
    report["seconds"] = round(time.time() - began, 1)
    (args.out / f"shared_gpu_w{dist.get_world_size()}_rank{rank}.json").write_text(
        json.dumps(report, indent=1)
    )
    print(summary_line(report), flush=True)
    torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
