"""The shm backend's fused fast paths (csrc/shm/fast_paths.cpp) in a world of one: the wiring only.

Their results across ranks are checked by the compatibility suite and the stress test
(tests/backends/test_shm.py), which run every planned op through them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch
import torch.distributed as torch_dist

from commlayer import dist
from commlayer.backends.shm import ShmBackend
from commlayer.core.types import ReduceOp
from commlayer.core.work import Work
from commlayer.facade.calls import dispatch
from commlayer.facade.groups.group import resolve_group


@pytest.fixture
def shm_backend() -> Iterator[ShmBackend]:
    dist.init_process_group(
        "shm", store=torch_dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=20)
    )
    try:
        backend = dist.group.WORLD.primary_backend
        assert isinstance(backend, ShmBackend)
        yield backend
    finally:
        dist.destroy_process_group()


def test_launchers_run_each_op_and_return_a_work_only_when_async(shm_backend: ShmBackend) -> None:
    tensor = torch.arange(6, dtype=torch.float32).view(2, 3)  # contiguous, not flattened
    output = torch.zeros(6)
    assert shm_backend.plan("all_reduce", ReduceOp.MAX)(False, tensor) is None
    assert shm_backend.plan("broadcast", 0)(False, tensor) is None
    assert shm_backend.plan("all_gather_into_tensor")(False, output, tensor) is None
    assert torch.equal(output, torch.arange(6.0))
    output.zero_()
    work = shm_backend.plan("reduce_scatter_tensor", ReduceOp.SUM)(True, output, tensor)
    assert isinstance(work, Work) and work.is_completed() and work.result() == [output]
    assert torch.equal(output, torch.arange(6.0)) and torch.equal(tensor.view(-1), torch.arange(6.0))


def test_launchers_reject_a_wrong_call_by_name(shm_backend: ShmBackend) -> None:
    run = shm_backend.plan("all_reduce", ReduceOp.SUM)
    with pytest.raises(TypeError, match=r"expected \(async_op, 1 tensor\(s\)\), received 3 arguments"):
        run(False, torch.ones(2), torch.ones(2))
    with pytest.raises(KeyError, match="complex64"):
        run(False, torch.ones(2, dtype=torch.complex64))
    assert shm_backend.plan("send") is None


def _planned_calls(async_op: bool) -> list[tuple[str, list[int], int, Work | None]]:
    """Each launched op twice (the second call runs its plan); (op, entry shape, root, work)."""
    made = []
    for _ in range(2):
        made.append(("all_reduce", [2, 3], -1, dist.all_reduce(torch.ones(2, 3), async_op=async_op)))
        made.append(("broadcast", [4], 0, dist.broadcast(torch.ones(4), src=0, async_op=async_op)))
        gathered = dist.all_gather_into_tensor(torch.zeros(1, 5), torch.ones(5), async_op=async_op)
        made.append(("all_gather_into_tensor", [1, 5], -1, gathered))  # the output is the payload
        scattered = dist.reduce_scatter_tensor(torch.zeros(3), torch.ones(3), async_op=async_op)
        made.append(("reduce_scatter_tensor", [3], -1, scattered))  # the input is the payload
    return made


@pytest.mark.parametrize("async_op", [False, True])
def test_launchers_enter_every_call_in_the_flight_recorder(shm_backend: ShmBackend, async_op: bool) -> None:
    recorder = resolve_group("test", None).recorder
    first = len(recorder.snapshot())
    made = _planned_calls(async_op)
    runs = [plan.run for plan in dispatch.plans.values()]
    assert len(runs) == 4 and all(type(run).__name__ == "builtin_function_or_method" for run in runs)
    entries = recorder.snapshot()[first:]
    assert [entry["seq"] for entry in entries] == list(range(first + 1, first + 1 + len(made)))
    for entry, (op, shape, root, work) in zip(entries, made):
        assert (entry["op"], entry["shape"], entry["root"], entry["dtype"]) == (op, shape, root, "float32")
        assert entry["state"] == "completed" and (work is not None) == async_op
        assert 0 < entry["queued_ns"] <= entry["completed_ns"] if not async_op else entry["queued_ns"] > 0
    del made, work
    if async_op:  # the ring holds an async call's Work weakly
        assert recorder.snapshot()[-1]["state"] == "released"
