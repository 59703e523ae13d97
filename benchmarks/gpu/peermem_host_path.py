"""The host's time per eager call on peermem (the default backend's CUDA half): its C fast path
against its Python one, against commlayer's plain nccl backend, and against torch.distributed's
own call.

The kernels serve groups of 2-8 GPUs, but the host's side of a call (the facade, the route, the
launch) does not depend on the group's size, so this runs on one GPU: groups of one whose region
is mapped directly, the kernels running as on a larger group. One process per fast-path kind
(``COMMLAYER_C_FAST_PATHS`` 1 and 0), alternating::

    python3 benchmarks/gpu/peermem_host_path.py --out DIR [--pairs 2] [--rounds 7]

Run it where commlayer is importable with its backends (``source benchmarks/gpu/site.sh``, then
from outside the checkout). Per op and size, six ways of one call: ``kernel`` (peermem, routed to
the kernels, one-shot), ``zero_copy`` (peermem's zero-copy kernels, the tensors placed through the
segment registry; the kernel ops only), ``branch`` (peermem, routed to NCCL, as the sizes NCCL
serves are: the route's lookup, then NCCL's fast path), ``default`` (the same through the default backend,
``cpu:gloo,cuda:peermem``), ``nccl`` (commlayer's nccl backend) and ``raw``
(``torch.distributed``'s call). Each is checked for the exact result first, then timed as the
host's microseconds per call while issuing 200 calls in a row behind a sleeping kernel, so that the
GPU never holds the host back (a round where the GPU caught up is not used). Large asynchronous
calls, issued and waited for as ZeRO issues its gathers and reductions (4 MiB, ``async_op=True``
then ``wait()``: peermem runs them on the group's own stream), are timed the same way, 50 in a row;
so are calls issued from two streams in turn, as FSDP2 issues its gathers and reductions (each
call's stream first waits for the group's previous kernel).
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as torch_dist

SIZES = (4096, 65536)  # bytes, bf16: small enough that the GPU keeps up with the host
OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "all_to_all_single")
IN_PLACE = ("all_reduce", "broadcast")
WAYS = ("kernel", "zero_copy", "branch", "default", "nccl", "raw")
KERNEL_OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")
CALLS = 200  # well inside CUDA's launch queue, so that launching never waits for the GPU
ASYNC_OPS = KERNEL_OPS
ASYNC_BYTES = 4 << 20  # past COMMLAYER_PEERMEM_ASYNC_BYTES' default: the group's stream
ASYNC_CALLS = 50  # each also records and waits for events: fewer, to stay inside the queue
SWITCH_OPS = ("all_reduce",)  # issued from two streams in turn
SLEEP_CYCLES = 50_000_000  # about 25 ms of GPU time: several times CALLS calls of the host


def _group_of_one(forced: list[str]) -> Callable[..., object]:
    """peermem's attach for a group of one: the region mapped directly, the routes ``forced``."""
    from commlayer.backends.peermem import board as boards
    from commlayer.backends.peermem.communicator import PeerComm
    from commlayer.backends.peermem.kernel_library import load_library

    def attach(spec: object) -> PeerComm:
        major, minor = torch.cuda.get_device_capability()
        lib = load_library(f"sm_{major}{minor}")
        handle, ipc = ctypes.c_void_p(), ctypes.create_string_buffer(lib.handle_bytes)
        half_bytes = 32 << 20
        rc = lib.lib.pm_create(0, 0, 1, half_bytes, int(60e9), ctypes.byref(handle), ipc)
        if rc:
            raise RuntimeError(f"pm_create: {lib.error_string(rc)}")
        board = boards.create(f"commlayer-peermem-host-path-{os.getpid()}-{len(forced)}")
        comm = PeerComm(lib, handle.value, spec, 0, half_bytes, board)
        comm.force(forced.pop(0))
        return comm

    return attach


Call = Callable[[], object]


def _calls(
    op: str, numel: int, group: object, async_op: bool = False, streams: int = 1
) -> tuple[Call, Call, torch.Tensor, torch.Tensor]:
    """commlayer's call on ``group``, torch's on the world, the call's result and what it must hold
    (a group of one: the input's values). An asynchronous call is waited for at once; with two
    ``streams`` each call is issued from the one the previous call did not use."""
    ours, theirs, result, expected = _one_stream_calls(op, numel, group, async_op)
    if streams == 1:
        return ours, theirs, result, expected
    sides = [torch.cuda.Stream() for _ in range(streams)]
    torch.cuda.synchronize()  # the tensors were made on the default stream, which they do not wait for
    return _in_turn(ours, sides), _in_turn(theirs, sides), result, expected


def _in_turn(call: Call, streams: list[torch.cuda.Stream]) -> Call:
    turns = itertools.cycle(streams)

    def issued_in_turn() -> object:
        with torch.cuda.stream(next(turns)):
            return call()

    return issued_in_turn


def _one_stream_calls(
    op: str, numel: int, group: object, async_op: bool
) -> tuple[Call, Call, torch.Tensor, torch.Tensor]:
    from commlayer import dist

    tensor = torch.arange(numel, device="cuda", dtype=torch.float32).to(torch.bfloat16)
    ours, theirs = getattr(dist, op), getattr(torch_dist, op)
    if op in IN_PLACE:
        arguments, result = (tensor,) if op == "all_reduce" else (tensor, 0), tensor
    else:
        result = torch.empty_like(tensor)
        arguments = (result, tensor)
    if async_op:
        return (
            (lambda: ours(*arguments, group=group, async_op=True).wait()),
            (lambda: theirs(*arguments, async_op=True).wait()),
            result,
            tensor.clone(),
        )
    return (lambda: ours(*arguments, group=group)), (lambda: theirs(*arguments)), result, tensor.clone()


def _host_us(calls: dict[str, Call], rounds: int, count: int = CALLS) -> dict[str, float]:
    """Per way, the median host microseconds per call over the rounds in which the GPU stayed busy.

    Each round times every way once, in turn, so that a slow spell of the host weighs on all alike,
    and starts one way further than the round before, so that no way is always timed first.
    """
    times: dict[str, list[float]] = {way: [] for way in calls}
    ways = list(calls.items())
    for round_index in range(rounds):
        shift = round_index % len(ways)
        for way, call in ways[shift:] + ways[:shift]:
            for _ in range(20):
                call()
            torch.cuda.synchronize()
            torch.cuda._sleep(SLEEP_CYCLES)
            busy = torch.cuda.Event()
            busy.record()
            start = time.perf_counter()
            for _ in range(count):
                call()
            elapsed = time.perf_counter() - start
            if not busy.query():
                times[way].append(elapsed / count * 1e6)
            torch.cuda.synchronize()
    if not all(times.values()):
        raise RuntimeError("the GPU finished its sleep before the host issued its calls in every round")
    return {way: statistics.median(values) for way, values in times.items()}


def worker(rounds: int) -> list[dict]:
    from commlayer import dist
    from commlayer.backends.peermem import backend

    # The forced routes of the peermem groups, in the order they are made below.
    backend.attach = _group_of_one(["one_shot", "zero_copy", "nccl", "nccl"])
    torch.cuda.set_device(0)
    dist.init_process_group("peermem", store=torch_dist.HashStore(), rank=0, world_size=1)
    groups = {
        "kernel": dist.group.WORLD,
        "zero_copy": dist.new_group([0]),
        "branch": dist.new_group([0]),
        "default": dist.new_group([0], backend="cpu:gloo,cuda:peermem"),
        "nccl": dist.new_group([0], backend="nccl"),
    }
    cases = [(op, nbytes, False, 1) for op in OPS for nbytes in SIZES]
    cases += [(op, ASYNC_BYTES, True, 1) for op in ASYNC_OPS]
    cases += [(op, nbytes, False, 2) for op in SWITCH_OPS for nbytes in SIZES]
    rows = []
    for op, nbytes, async_op, streams in cases:
        calls: dict[str, Call] = {}
        for way, group in groups.items():
            if way == "kernel" and op == "all_to_all_single":
                continue  # its kernel places tensors through peers' mappings: none in a group of one
            if way == "zero_copy" and op not in KERNEL_OPS:
                continue
            calls[way], calls["raw"], result, expected = _calls(op, nbytes // 2, group, async_op, streams)
            for call in (calls[way], calls["raw"]):
                if op not in IN_PLACE:
                    result.zero_()
                call()
                torch.cuda.synchronize()
                assert torch.equal(result, expected), f"{op} {nbytes} B ({way}): wrong result"
        count = ASYNC_CALLS if async_op else CALLS
        row = {"op": op, "bytes": nbytes, "async": async_op, "streams": streams}
        rows.append(row | _host_us(calls, rounds, count))
    dist.destroy_process_group()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        print(json.dumps(worker(options.rounds)))
        return
    runs: dict[str, list[list[dict]]] = {"1": [], "0": []}
    for _ in range(options.pairs):
        for c_fast_paths, kind_runs in runs.items():
            command = [
                sys.executable,
                __file__,
                "--worker",
                "--out",
                str(options.out),
                "--rounds",
                str(options.rounds),
            ]
            environment = os.environ | {"COMMLAYER_C_FAST_PATHS": c_fast_paths}
            done = subprocess.run(
                command, env=environment, capture_output=True, text=True, timeout=300, check=True
            )
            kind_runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    options.out.mkdir(parents=True, exist_ok=True)
    payload = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "runs": runs}
    (options.out / "peermem_host_path.json").write_text(json.dumps(payload, indent=1))
    _print(runs)


def _print(runs: dict[str, list[list[dict]]]) -> None:
    print(f"op | bytes | async | streams | C: {' / '.join(WAYS)} us | Python: {' / '.join(WAYS)} us")
    for index, row in enumerate(runs["1"][0]):
        cells = []
        for kind in ("1", "0"):
            median = {
                way: statistics.median(run[index][way] for run in runs[kind]) if way in row else None
                for way in WAYS
            }
            cells.append(" / ".join("-" if us is None else f"{us:.2f}" for us in median.values()))
        print(f"{row['op']} | {row['bytes']} | {row['async']} | {row['streams']} | {cells[0]} | {cells[1]}")


if __name__ == "__main__":
    main()
