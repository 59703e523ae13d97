"""The shm backend's fused launchers (csrc/shm/launcher.cpp) in a world of one: the wiring only.

Their results across ranks are checked by the compatibility suite and the stress test
(tests/test_shm.py), which run every planned op through them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch
import torch.distributed as torch_dist

from commlayer import dist
from commlayer.backends.shm import ShmBackend
from commlayer.types import ReduceOp
from commlayer.work import Work


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
