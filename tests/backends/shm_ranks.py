"""Checks of the shm backend beyond the compatibility suite, run by tests/backends/test_shm.py.

- ``two_level``: split the ranks over simulated hosts (COMMLAYER_HOST_ID per rank, interleaved
  so no host holds consecutive ranks) and run the whole compatibility suite, two-level;
- ``paths``: every native op at sizes on both sides of each path switch, with tiny buffers that
  force many rounds, on the world and a subgroup, for several dtypes;
- ``stress``: thousands of ops of random kind, size, dtype and async_op (async results waited for
  in random order), every result checked;
- ``mixed_async``: ranks disagree on async_op for the same ops;
- ``no_segments``: after init nothing of the job is left in /dev/shm;
- ``placement``: ranks put on one CPU spread out; then a forked child's exit is not its parent's.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import torch

from commlayer import dist
from commlayer.backends.shm import ShmOptions
from commlayer.core.rendezvous import discover
from commlayer.core.types import ReduceOp
from commlayer.testing import conformance
from commlayer.testing.conformance import assert_equal, reduced, values

TINY = ShmOptions(small_bytes=256, chunk_bytes=4096, spins=16)
PATH_SIZES = (1, 7, 31, 32, 33, 63, 64, 65, 200, 1000, 1024, 1025, 5000)
PATH_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8, torch.bool)


def two_level(hosts: str) -> None:
    rank = discover(os.environ).rank
    os.environ["COMMLAYER_HOST_ID"] = f"simulated-host-{rank % int(hosts)}"
    dist.init_process_group("shm")
    backend = dist.group.WORLD.primary_backend
    assert type(backend).__name__ == "TwoLevelBackend", type(backend)
    conformance.main()
    paths_on(None, list(range(dist.get_world_size())))
    dist.destroy_process_group()


def everything(stress_ops: str) -> None:
    """One world for the checks below (spawning is the expensive part)."""
    paths()
    mixed_async()
    stress(stress_ops)
    no_segments()


def paths() -> None:
    world = dist.get_world_size()
    sub = list(range(1, world)) if world > 2 else [1, 0]
    tiny_world = dist.new_group(list(range(world)), pg_options=TINY)
    tiny_sub = dist.new_group(sub, pg_options=TINY)
    for group, members in ((None, list(range(world))), (tiny_world, list(range(world))), (tiny_sub, sub)):
        paths_on(group, members)


def paths_on(group: object, members: list[int]) -> None:
    me = dist.get_rank()
    if me not in members:
        return
    for salt, numel in enumerate(PATH_SIZES):
        for dtype in PATH_DTYPES:
            _check_every_op(group, members, me, numel, dtype, salt=salt)


def stress(count: str) -> None:
    world, me = dist.get_world_size(), dist.get_rank()
    group = dist.new_group(list(range(world)), pg_options=TINY)
    shared = random.Random(1234)  # same draws on every rank: same ops in the same order
    private = random.Random(me)  # each rank decides async_op and wait order alone
    pending: list[tuple[object, torch.Tensor, torch.Tensor, str]] = []
    for index in range(int(count)):
        kind = shared.choice(("all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all"))
        numel = shared.choice((1, 3, 64, 100, 700, 3000)) * world
        dtype = shared.choice((torch.float32, torch.int32, torch.bfloat16))
        root = shared.randrange(world)
        work, actual, expected = _launch(
            kind, group, list(range(world)), me, numel, dtype, root, index, private
        )
        pending.append((work, actual, expected, f"stress #{index} {kind} {numel} {dtype}"))
        if len(pending) > 16 or private.random() < 0.2:
            private.shuffle(pending)
            for work, actual, expected, label in pending:
                if work is not None:
                    work.wait()
                assert_equal(actual, expected, label)
            pending.clear()
    for work, actual, expected, label in pending:
        if work is not None:
            work.wait()
        assert_equal(actual, expected, label)


def mixed_async() -> None:
    me, world = dist.get_rank(), dist.get_world_size()
    for index in range(50):
        tensor = values(me, torch.float32, numel=100, salt=index)
        work = dist.all_reduce(tensor, async_op=(me + index) % 2 == 0)
        if work is not None:
            work.wait()
        assert_equal(tensor, reduced(list(range(world)), torch.float32, ReduceOp.SUM, 100, index), "mixed")


def no_segments() -> None:
    dist.barrier()
    pids = [torch.tensor([os.getpid()])]
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, pids[0])
    ours = {f"commlayer-{int(pid)}-" for pid in gathered}
    left = [entry.name for entry in Path("/dev/shm").iterdir() if any(entry.name.startswith(p) for p in ours)]
    assert not left, f"segments left in /dev/shm after init: {left}"


# --- helpers -----------------------------------------------------------------------------------


def _check_every_op(
    group: object, members: list[int], me: int, numel: int, dtype: torch.dtype, salt: int
) -> None:
    rng = random.Random(salt)
    for kind in ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all"):
        work, actual, expected = _launch(
            kind, group, members, me, numel * len(members), dtype, rng.randrange(len(members)), salt, rng
        )
        if work is not None:
            work.wait()
        assert_equal(actual, expected, f"{kind} numel={numel} {dtype} group={members}")


def _launch(kind, group, members, me, numel, dtype, root, salt, rng):
    """Start one op; returns (work or None, tensor it writes, expected contents)."""
    size, rank = len(members), members.index(me)
    async_op = rng.random() < 0.5
    mine = values(me, dtype, numel=numel, salt=salt)
    everyone = [values(m, dtype, numel=numel, salt=salt) for m in members]
    op = ReduceOp.SUM if dtype is not torch.bool else ReduceOp.MAX
    if kind == "all_reduce":
        return (
            dist.all_reduce(mine, op=op, group=group, async_op=async_op),
            mine,
            reduced(members, dtype, op, numel, salt),
        )
    if kind == "broadcast":
        return dist.broadcast(mine, members[root], group=group, async_op=async_op), mine, everyone[root]
    block = numel // size
    if kind == "all_gather":
        out = torch.empty(size * block, dtype=dtype)
        expected = torch.cat([e[:block] for e in everyone])
        return (
            dist.all_gather_into_tensor(out, mine[:block].clone(), group=group, async_op=async_op),
            out,
            expected,
        )
    if kind == "reduce_scatter":
        out = torch.empty(block, dtype=dtype)
        expected = reduced(members, dtype, op, numel, salt)[rank * block : (rank + 1) * block]
        return dist.reduce_scatter_tensor(out, mine, op=op, group=group, async_op=async_op), out, expected
    out = torch.empty(numel, dtype=dtype)
    expected = torch.cat([e[rank * block : (rank + 1) * block] for e in everyone])
    return dist.all_to_all_single(out, mine, group=group, async_op=async_op), out, expected


def placement() -> None:
    """Two ranks put on one CPU (as the scheduler does after sleeping waits) spread out within a
    few ops: the waiting higher rank moves itself (csrc/shm/placement.hpp), keeping its mask."""
    dist.init_process_group("shm")
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2 or (os.cpu_count() or 1) < 2:
        print("placement: fewer than 2 CPUs allowed, nothing to check")
        return
    os.sched_setaffinity(0, {min(allowed)})  # both ranks onto one CPU, then their own mask back
    os.sched_setaffinity(0, allowed)
    rank, expected = dist.get_rank(), torch.full((4,), 3.0)
    for _ in range(200):  # far fewer ops than the scheduler's own balancing takes to move a rank
        tensor = torch.full((4,), float(rank + 1))
        dist.all_reduce(tensor)
        assert_equal(tensor, expected, "all_reduce while placed on one CPU")
    cpus: list[object] = [None, None]
    dist.all_gather_object(cpus, _current_cpu())
    assert cpus[0] != cpus[1], f"both ranks still on CPU {cpus[0]} after 200 ops"
    assert os.sched_getaffinity(0) == allowed, "the rank's affinity mask changed"
    forked_child_exit()
    dist.destroy_process_group()


def forked_child_exit() -> None:
    """A child forked by rank 0 runs shm's exit hook (as its interpreter would at exit): rank 0 is
    still alive, so rank 1, already waiting for it in the next op, must not see a departure."""
    from commlayer.backends.shm import backend as shm_backend

    rank = dist.get_rank()
    if rank == 0:
        child = os.fork()
        if child == 0:
            shm_backend._depart_at_exit()
            os._exit(0)
        os.waitpid(child, 0)
        time.sleep(0.3)  # rank 1 waits long enough to yield and read rank 0's liveness word
    tensor = torch.arange(4.0) + 10 * rank
    dist.all_reduce(tensor)
    assert_equal(tensor, torch.arange(4.0) * 2 + 10, "all_reduce after rank 0's forked child exited")


def _current_cpu() -> int:
    stat = Path("/proc/thread-self/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[36])
