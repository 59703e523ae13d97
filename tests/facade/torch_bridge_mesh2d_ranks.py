"""torch's own 2-D DeviceMesh, DTensor and FSDP2 HSDP on a ``init_process_group("commlayer")`` world.

One world of 4 ranks under mpirun (COMMLAYER_BACKEND=mpi; ccl runs it too): torch's
``init_device_mesh("cpu", (2, 2))`` builds each mesh dimension with torch's
``new_group(backend="commlayer")``, which the bridge answers with commlayer groups built by their
members. The same mesh on torch's gloo (``backend_override``) in the same world is the reference:
DTensor results must be equal and HSDP parameters within 1e-6, as DDP's over the world's bridge
against a gloo group's. The world also checks that the bridge's futures complete in the
background (COMMLAYER_BRIDGE_FUTURES=background: on a rank without a spare core "auto" completes
them inline) and in order, and that bad input gets the facade's errors.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.distributed as torch_dist
from torch import nn

from commlayer import dist
from commlayer.facade.torch_bridge.process_group import CommlayerProcessGroup

STEPS = 3
TOLERANCE = 1e-6
DIMS = ("replicate", "shard")


def main() -> None:
    _on_commlayer_meshes(_ddp_and_futures)


def on_shm() -> None:
    """The same mesh on shm, whose groups stand on gloo companions: torch asks only each group's
    members to build it, and the companions synchronise only them.
    """
    _on_commlayer_meshes(lambda mesh, rank: _members_only_new_group_is_refused(rank))


def _on_commlayer_meshes(more_checks: Callable[[torch_dist.DeviceMesh, int], None]) -> None:
    """A ``"commlayer"`` world with torch's 2-D mesh on it and the same mesh on gloo: the checks
    every backend passes, then ``more_checks(mesh, rank)``."""
    torch_dist.init_process_group("commlayer")
    try:
        rank = torch_dist.get_rank()
        mesh = torch_dist.init_device_mesh("cpu", (2, 2), mesh_dim_names=DIMS)
        reference = torch_dist.init_device_mesh(
            "cpu", (2, 2), mesh_dim_names=DIMS, backend_override={name: "gloo" for name in DIMS}
        )
        _mesh_groups_are_commlayer(mesh, rank)
        _dtensor_matches_gloo(mesh, reference)
        _hsdp_matches_gloo(mesh, reference)
        _bad_input_gets_the_facade_errors(mesh.get_group("replicate"), rank)
        more_checks(mesh, rank)
    finally:
        torch_dist.destroy_process_group()


def _ddp_and_futures(mesh: torch_dist.DeviceMesh, rank: int) -> None:
    _ddp_with_background_futures_matches_gloo()
    _futures_complete_in_background_in_order(mesh.get_group("shard"), rank)


def _mesh_groups_are_commlayer(mesh: torch_dist.DeviceMesh, rank: int) -> None:
    """Each dimension's group runs on $COMMLAYER_BACKEND through commlayer; its collectives are exact."""
    for dim, name in enumerate(DIMS):
        pg = mesh.get_group(name)
        assert isinstance(pg, CommlayerProcessGroup), (name, pg)
        assert pg.commlayer_group.primary_backend.name == os.environ["COMMLAYER_BACKEND"], pg
        ranks = torch_dist.get_process_group_ranks(pg)
        assert rank in ranks and len(ranks) == 2, (name, ranks)
        value = torch.tensor([rank + 1.0, 10.0 * (rank + 1)], dtype=torch.float64)
        torch_dist.all_reduce(value, group=pg)
        expected = sum(torch.tensor([r + 1.0, 10.0 * (r + 1)], dtype=torch.float64) for r in ranks)
        assert torch.equal(value, expected), (name, dim, value, expected)


def _dtensor_matches_gloo(mesh: torch_dist.DeviceMesh, reference: torch_dist.DeviceMesh) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    full = torch.arange(48.0).view(8, 6) / 7
    results = []
    for device_mesh in (mesh, reference):
        sharded = distribute_tensor(full, device_mesh, [Shard(0), Shard(1)])
        replicated = sharded.redistribute(device_mesh, [Replicate(), Replicate()]).to_local()
        assert torch.equal(replicated, full), replicated
        product = (sharded @ sharded.T).full_tensor()
        column_sums = sharded.sum(dim=0).full_tensor()
        results.append((product, column_sums))
    (product, sums), (expected_product, expected_sums) = results
    assert (product - expected_product).abs().max() <= TOLERANCE, (product, expected_product)
    assert (sums - expected_sums).abs().max() <= TOLERANCE, (sums, expected_sums)


def _hsdp_matches_gloo(mesh: torch_dist.DeviceMesh, reference: torch_dist.DeviceMesh) -> None:
    """FSDP2 HSDP (replicate x shard) trains to gloo's parameters."""
    from torch.distributed.fsdp import fully_shard

    trained = []
    for device_mesh in (mesh, reference):
        torch.manual_seed(0)
        model = _model()
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=device_mesh)
        fully_shard(model, mesh=device_mesh)
        _train(model)
        trained.append({name: p.full_tensor().detach().clone() for name, p in model.named_parameters()})
    _assert_close("HSDP", *trained)


def _ddp_with_background_futures_matches_gloo() -> None:
    """DDP over the world's bridge (many small buckets, futures completed in the background)."""
    gloo = torch_dist.new_group(backend="gloo")
    trained = []
    for pg in (torch_dist.group.WORLD, gloo):
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(_model(), process_group=pg, bucket_cap_mb=0.0001)
        _train(model)
        trained.append({name: p.detach().clone() for name, p in model.module.named_parameters()})
    assert isinstance(torch_dist.group.WORLD, CommlayerProcessGroup), torch_dist.group.WORLD
    _assert_close("DDP", *trained)


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _train(model: nn.Module) -> None:
    """STEPS of SGD on data seeded by step and rank: the same on every backend."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        generator = torch.Generator().manual_seed(100 * step + torch_dist.get_rank())
        model(torch.randn(5, 8, generator=generator)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def _assert_close(label: str, ours: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    for name, value in expected.items():
        difference = (ours[name] - value).abs().max().item()
        assert difference <= TOLERANCE, f"{label} {name}: off by {difference}"


def _futures_complete_in_background_in_order(pg: torch_dist.ProcessGroup, rank: int) -> None:
    """get_future returns before the op can complete, and futures complete in issue order.

    The group's rank 1 joins only once rank 0 has checked that its future is still pending, so
    a get_future that waited for the op (the old bridge) would hang here until the timeout.
    """
    store, group_rank = torch_dist.distributed_c10d._get_default_store(), pg.rank()
    key = f"futures-checked-{torch_dist.get_process_group_ranks(pg)}"
    tensors = [torch.full((3,), float(10 * index + rank)) for index in range(6)]
    if group_rank == 1:
        store.wait([key])
    order: list[int] = []
    futures = [
        pg.allreduce([tensor]).get_future().then(_recorder(order, index))
        for index, tensor in enumerate(tensors)
    ]
    if group_rank == 0:
        assert not futures[0].done(), "get_future waited for an op its peer had not joined"
        store.set(key, b"1")
    torch.futures.wait_all(futures)
    assert order == list(range(len(tensors))), order
    ranks = torch_dist.get_process_group_ranks(pg)
    for index, tensor in enumerate(tensors):
        assert torch.equal(tensor, torch.full((3,), float(sum(10 * index + r for r in ranks)))), tensor


def _recorder(order: list[int], index: int) -> Callable[[torch.futures.Future], list[torch.Tensor]]:
    def record(future: torch.futures.Future) -> list[torch.Tensor]:
        order.append(index)
        return future.value()

    return record


def _bad_input_gets_the_facade_errors(pg: CommlayerProcessGroup, rank: int) -> None:
    """Every rank passes the same bad input: the bridge raises the facade's error, nobody communicates."""
    group = pg.commlayer_group
    cases: list[tuple[Callable[[], object], Callable[[], object]]] = [
        (
            lambda: dist.all_gather_into_tensor(torch.empty(5), torch.ones(2), group=group),
            lambda: torch_dist.all_gather_into_tensor(torch.empty(5), torch.ones(2), group=pg),
        ),
        (
            lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), dist.ReduceOp.AVG, group=group),
            lambda: pg.allreduce([torch.ones(2, dtype=torch.int32)], _options(torch_dist.ReduceOp.AVG)),
        ),
        (
            lambda: dist.reduce_scatter_tensor(torch.empty(3), torch.ones(4), group=group),
            lambda: torch_dist.reduce_scatter_tensor(torch.empty(3), torch.ones(4), group=pg),
        ),
        (
            lambda: dist.all_gather_into_tensor(
                torch.empty(4), torch.ones(2, dtype=torch.int64), group=group
            ),
            lambda: pg._allgather_base(torch.empty(4), torch.ones(2, dtype=torch.int64)),
        ),
    ]
    for facade, bridge in cases:
        expected, received = _error_of(facade), _error_of(bridge)
        assert expected is not None and received is not None, (expected, received)
        assert (type(received), str(received)) == (type(expected), str(expected)), (received, expected)
        assert f"rank {rank}" in str(received), received
    not_single = _error_of(lambda: pg.allreduce([torch.ones(1), torch.ones(1)]))
    assert isinstance(not_single, ValueError) and "all_reduce: argument 'tensors'" in str(not_single)
    torch_dist.barrier(group=pg)  # nobody communicated above: the group is still in step


def _options(op: torch_dist.ReduceOp) -> torch_dist.AllreduceOptions:
    options = torch_dist.AllreduceOptions()
    options.reduceOp = op
    return options


def _error_of(call: Callable[[], object]) -> BaseException | None:
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the error is what is compared
        return error
    return None


def _members_only_new_group_is_refused(rank: int) -> None:
    """``use_local_synchronization`` (only the members call torch's new_group): torch would give the
    gloo companion the group's own hashed name, so shm refuses it clearly, and nothing hangs."""
    from commlayer.core.errors import UnsupportedError

    if rank in (0, 1):
        error = _error_of(lambda: torch_dist.new_group([0, 1], use_local_synchronization=True))
        assert isinstance(error, UnsupportedError), error
        assert "use_local_synchronization=True" in str(error) and f"global rank {rank}" in str(error), error
    value = torch.tensor([rank + 1.0])
    torch_dist.all_reduce(value)  # the world is still in step
    assert value.item() == 10.0, value
