"""torch's parallelism stack on a commlayer world: DDP, FSDP2, tensor parallelism, DCP, compile.

``train(out_dir)`` runs on any backend (gloo, mpi, ccl) with the same seeds and data and saves each
model's final parameters to ``out_dir/<backend>-rank<r>.pt``; the pytest side compares the files
of mpi and ccl against gloo's. Every model starts from the same seed on every rank and sees data
that differs per rank, so a wrong reduction changes the parameters.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as torch_dist
from torch import nn

from commlayer import dist

from . import torch_bridge_semantics_ranks as torch_semantics

STEPS = 3


def train(out_dir: str) -> None:
    torch_semantics.run_all()
    pg = dist.group.WORLD.torch_group
    results = {"ddp": _ddp(pg), "fsdp2": _fsdp2(), "tp": _tensor_parallel()}
    _checkpoint_round_trip(Path(out_dir) / f"dcp-{dist.get_backend()}")
    _commlayer_mesh_as_device_mesh()
    results["compiled"] = _compiled_collectives()
    path = Path(out_dir) / f"{dist.get_backend()}-rank{dist.get_rank()}.pt"
    torch.save(results, path)
    print(f"saved {sorted(results)} to {path}", file=sys.stderr)


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _batch(step: int, same_on_every_rank: bool = False) -> torch.Tensor:
    generator = torch.Generator().manual_seed(100 * step + (0 if same_on_every_rank else dist.get_rank() + 1))
    return torch.randn(5, 8, generator=generator)


def _steps(model: nn.Module, same_data: bool = False) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        loss = model(_batch(step, same_data)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def _ddp(pg: torch_dist.ProcessGroup) -> dict[str, torch.Tensor]:
    model = nn.parallel.DistributedDataParallel(_model(), process_group=pg, bucket_cap_mb=0.0001)
    _steps(model)
    return {name: p.detach().clone() for name, p in model.module.named_parameters()}


def _fsdp2() -> dict[str, torch.Tensor]:
    from torch.distributed.fsdp import fully_shard

    mesh = dist.init_device_mesh("cpu", (dist.get_world_size(),))
    model = _model(1)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    _steps(model)
    return {name: p.full_tensor().detach().clone() for name, p in model.named_parameters()}


def _tensor_parallel() -> dict[str, torch.Tensor]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = dist.init_device_mesh("cpu", (dist.get_world_size(),))
    model = _model(2)
    model[0] = nn.Linear(8, 6 * dist.get_world_size())  # shardable by any world size
    model[2] = nn.Linear(6 * dist.get_world_size(), 4)
    torch.manual_seed(3)
    model = parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    _steps(model, same_data=True)
    return {name: p.full_tensor().detach().clone() for name, p in model.named_parameters()}


def _checkpoint_round_trip(directory: Path) -> None:
    """torch.distributed.checkpoint saves sharded FSDP2 parameters and loads them back exactly."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import fully_shard

    mesh = dist.init_device_mesh("cpu", (dist.get_world_size(),))
    model = fully_shard(_model(4), mesh=mesh)
    saved = {name: p.full_tensor().clone() for name, p in model.state_dict().items()}
    dcp.save(model.state_dict(), checkpoint_id=str(directory))
    fresh = fully_shard(_model(5), mesh=mesh)
    state = fresh.state_dict()
    dcp.load(state, checkpoint_id=str(directory))
    fresh.load_state_dict(state)
    for name, p in fresh.state_dict().items():
        assert torch.equal(p.full_tensor(), saved[name]), f"DCP round trip changed {name}"


def _commlayer_mesh_as_device_mesh() -> None:
    """A commlayer mesh converts to a torch DeviceMesh on the same groups; DTensor redistributes on it."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from commlayer.mesh import init_mesh

    mesh = init_mesh((dist.get_world_size(), 1), ("dp", "tp"))
    device_mesh = mesh.to_device_mesh("cpu")
    assert device_mesh.shape == (dist.get_world_size(), 1), device_mesh
    assert device_mesh.get_group("dp") is mesh["dp"].group.torch_group
    full = torch.arange(6.0 * dist.get_world_size()).view(-1, 2)
    sharded = distribute_tensor(full, device_mesh, [Shard(0), Replicate()])
    assert sharded.to_local().shape[0] == full.shape[0] // dist.get_world_size(), sharded.to_local().shape
    replicated = sharded.redistribute(device_mesh, [Replicate(), Replicate()])
    assert torch.equal(replicated.to_local(), full), replicated.to_local()


def _compiled_collectives() -> dict[str, torch.Tensor]:
    """A function calling commlayer.dist collectives, compiled with fullgraph=True."""

    def step(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        dist.all_reduce(y)
        gathered = torch.empty(dist.get_world_size() * y.numel())
        dist.all_gather_into_tensor(gathered, y)
        return gathered + 1

    x = torch.arange(4.0) + 10 * dist.get_rank()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(x.clone())
    eager = step(x.clone())
    assert torch.equal(compiled, eager), f"compiled {compiled} != eager {eager}"
    return {"compiled": compiled}
