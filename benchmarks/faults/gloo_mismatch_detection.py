"""Which mismatched collectives gloo catches by itself, and what commlayer's default check adds.

For every op the facade sends to gloo (all_reduce, reduce, broadcast, all_gather,
all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, all_to_all, all_to_all_single,
gather, scatter) and every difference one rank can make (element count, dtype of the same element
size, root, reduce op; uneven all_to_all_single splits that do not pair up), a fresh 2-rank gloo
world (group timeout 3 s) in which rank 1 makes the difference, once with
``COMMLAYER_GLOO_VERIFY=0`` (gloo alone, as in plain torch) and once with the default check. Each
rank records what its call did: returned (with no error: garbage or a meaningless result), raised
(type, seconds), or died (exit code).

    python benchmarks/faults/gloo_mismatch_detection.py [--modes off,on] [--ops all_reduce,...] [--out PATH]

prints one line per case, and writes the outcomes as JSON to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
WORLD_LIMIT_S = 40
ROOTED = ("reduce", "broadcast", "gather", "scatter")
REDUCING = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor")
OPS = (
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
)


def cases() -> list[tuple[str, str]]:
    """(op, difference) pairs: count and dtype for every op, root and reduce op where they exist."""
    listed = [(op, kind) for op in OPS for kind in ("count", "dtype")]
    listed += [(op, "root") for op in ROOTED] + [(op, "reduce_op") for op in REDUCING]
    return [*listed, ("all_to_all_single", "splits")]


def _call(op: str, kind: str, rank: int) -> Callable[[], Any]:
    """Rank ``rank``'s call; rank 1 makes the difference ``kind``."""
    import torch

    from commlayer import dist

    odd = rank == 1
    n = 8 if odd and kind == "count" else 4
    dtype = torch.int32 if odd and kind == "dtype" else torch.float32
    root = 1 if odd and kind == "root" else 0
    reduce_op = dist.ReduceOp.MAX if odd and kind == "reduce_op" else dist.ReduceOp.SUM

    # "splits": rank 1 sends 3 elements to rank 0 and 5 to itself; rank 0 expects 4 from each.
    splits = ([4, 4], [3, 5] if odd else [4, 4]) if kind == "splits" else (None, None)

    def tensor(count: int = n) -> Any:
        return (torch.arange(count) + 100 * rank).to(dtype)

    calls = {
        "all_reduce": lambda: dist.all_reduce(tensor(), op=reduce_op),
        "reduce": lambda: dist.reduce(tensor(), dst=root, op=reduce_op),
        "broadcast": lambda: dist.broadcast(tensor(), src=root),
        "all_gather": lambda: dist.all_gather([tensor(), tensor()], tensor()),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(tensor(2 * n), tensor()),
        "reduce_scatter": lambda: dist.reduce_scatter(tensor(), [tensor(), tensor()], op=reduce_op),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(tensor(), tensor(2 * n), op=reduce_op),
        "all_to_all": lambda: dist.all_to_all([tensor(), tensor()], [tensor(), tensor()]),
        "all_to_all_single": lambda: dist.all_to_all_single(tensor(2 * n), tensor(2 * n), *splits),
        "gather": lambda: dist.gather(tensor(), [tensor(), tensor()] if rank == root else None, dst=root),
        "scatter": lambda: dist.scatter(tensor(), [tensor(), tensor()] if rank == root else None, src=root),
    }
    return calls[op]


def rank_body(op: str, kind: str, out: Path) -> None:
    from commlayer import dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    rank = dist.get_rank()
    call = _call(op, kind, rank)
    started = time.monotonic()
    record: dict[str, Any] = {"rank": rank}
    try:
        call()
        record["outcome"] = "returned"
    except Exception as error:  # noqa: BLE001 - the record is the result
        record["outcome"] = type(error).__name__
        record["message"] = str(error).splitlines()[0][:300] if str(error) else ""
    record["seconds"] = round(time.monotonic() - started, 2)
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


def run_case(op: str, kind: str, verify: bool) -> dict[str, Any]:
    """One fresh 2-rank world; each rank's record, or how its process ended."""
    sys.path.insert(0, str(ROOT))
    from commlayer.core.ports import free_port

    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory)
        port = free_port()
        processes = [_start(op, kind, out, rank, port, verify) for rank in range(2)]
        codes = _wait(processes)
        ranks = {}
        for rank, code in enumerate(codes):
            path = out / f"rank{rank}.json"
            ranks[rank] = json.loads(path.read_text()) if path.exists() else {"outcome": f"died ({code})"}
    return {"op": op, "kind": kind, "verify": verify, "ranks": ranks}


def _start(op: str, kind: str, out: Path, rank: int, port: int, verify: bool) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": "2",
        "COMMLAYER_GLOO_VERIFY": "1" if verify else "0",
        "COMMLAYER_HEARTBEAT_INTERVAL": "0.2",
    }
    command = [sys.executable, __file__, "--rank-body", op, kind, str(out)]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait(processes: list[subprocess.Popen]) -> list[int | None]:
    deadline = time.monotonic() + WORLD_LIMIT_S
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return [process.returncode for process in processes]


def _line(result: dict[str, Any]) -> str:
    cells = []
    for rank in ("0", "1"):
        record = result["ranks"].get(rank) or result["ranks"].get(int(rank))
        seconds = f" {record['seconds']} s" if "seconds" in record else ""
        cells.append(f"rank {rank}: {record['outcome']}{seconds}")
    check = "check on " if result["verify"] else "check off"
    return f"{check} {result['op']:<23} {result['kind']:<10} {'; '.join(cells)}"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-body":
        rank_body(sys.argv[2], sys.argv[3], Path(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--modes", default="off,on", help="off: COMMLAYER_GLOO_VERIFY=0; on: the default")
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated ops to probe")
    parser.add_argument("--kinds", default="", help="comma-separated differences to probe (default: all)")
    parser.add_argument("--out", type=Path, default=None, help="write the outcomes here as JSON")
    args = parser.parse_args()
    ops, kinds = set(args.ops.split(",")), set(args.kinds.split(",")) if args.kinds else None
    results = []
    for mode in args.modes.split(","):
        for op, kind in cases():
            if op in ops and (kinds is None or kind in kinds):
                results.append(run_case(op, kind, mode == "on"))
                print(_line(results[-1]), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps({"load": os.getloadavg()[0], "results": results}, indent=1))


if __name__ == "__main__":
    main()
