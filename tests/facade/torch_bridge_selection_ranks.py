"""Rank code of test_torch_bridge_selection.py: torch's ``init_process_group("commlayer")`` where
commlayer's selection is the CUDA host's default (``cpu:gloo,cuda:peermem``).

On a CPU host the CUDA half has no device to serve, so the world's CPU half (commlayer's gloo)
must carry DDP, FSDP2, DTensor and a fullgraph-compiled collective through the bridge, each equal
to the same work on a torch gloo group of the same ranks.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as torch_dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from commlayer.contract.selection import DEFAULT_BY_ACCELERATOR
from commlayer.facade.torch_bridge.process_group import CommlayerProcessGroup

STEPS = 3


def main() -> None:
    torch_dist.init_process_group("commlayer")
    world = torch_dist.group.WORLD
    assert isinstance(world, CommlayerProcessGroup), world
    assert (
        world.commlayer_group.backend_spec
        == DEFAULT_BY_ACCELERATOR["cuda"]
        == os.environ["COMMLAYER_BACKEND"]
    )
    assert isinstance(world._get_backend(torch.device("cpu")), torch_dist.ProcessGroupGloo)
    rank, size = torch_dist.get_rank(), torch_dist.get_world_size()
    values = torch.arange(6, dtype=torch.float64) + 10 * rank
    torch_dist.all_reduce(values)
    assert torch.equal(values, sum(torch.arange(6, dtype=torch.float64) + 10 * r for r in range(size)))
    gloo = torch_dist.new_group(backend="gloo")
    assert _ddp(world) == _ddp(gloo)
    assert _fsdp2(init_device_mesh("cpu", (size,))) == _fsdp2(DeviceMesh.from_group(gloo, "cpu"))
    _dtensor(init_device_mesh("cpu", (size,)), rank, size)
    _compiled(world, rank, size)
    torch_dist.destroy_process_group()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _train(model: nn.Module) -> list[list[float]]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        inputs = torch.randn(
            5, 8, generator=torch.Generator().manual_seed(100 * step + torch_dist.get_rank())
        )
        model(inputs).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.full_tensor().tolist() if hasattr(p, "full_tensor") else p.tolist() for p in model.parameters()]


def _ddp(group: torch_dist.ProcessGroup) -> list[list[float]]:
    return _train(nn.parallel.DistributedDataParallel(_model(), process_group=group))


def _fsdp2(mesh: DeviceMesh) -> list[list[float]]:
    model = _model()
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return _train(model)


def _dtensor(mesh: DeviceMesh, rank: int, size: int) -> None:
    full = torch.arange(4 * size, dtype=torch.float32).reshape(2 * size, 2)
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    assert torch.equal(sharded.to_local(), full.chunk(size)[rank])
    assert torch.equal(sharded.redistribute(mesh, [Replicate()]).to_local(), full)


def _compiled(group: torch_dist.ProcessGroup, rank: int, size: int) -> None:
    def step(x: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(x * 2, "sum", group) + 1

    x = torch.arange(4, dtype=torch.float32) + rank
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(x)
    expected = sum(2 * (torch.arange(4, dtype=torch.float32) + r) for r in range(size)) + 1
    assert torch.equal(compiled, expected), (compiled, expected)
