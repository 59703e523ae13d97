"""Hybrid-sharded ZeRO (MiCS-style ``mics_shard_size`` and ``replicate_dims`` on a mesh).

Tier 1 checks how the arguments map onto mesh dims; tier 3 trains in a gloo world of 4 and an
mpirun world of 2 against single-process training and moves checkpoints between mesh shapes
(see tests/zero/zero_hybrid_ranks.py).
"""

from __future__ import annotations

import pytest

from commlayer.mesh import init_mesh
from commlayer.testing import require_mpirun, run_world
from commlayer.zero import ZeroConfigError, load_config
from commlayer.zero.hybrid import DataParallelDims, plan_data_parallel


def test_mics_shard_size_plans_a_replicate_by_dp_mesh() -> None:
    config = load_config({"train_batch_size": 8, "zero_optimization": {"stage": 3, "mics_shard_size": 4}})
    dims, shape = plan_data_parallel(config, None, (), world_size=8, rank=0)
    assert dims == DataParallelDims(("dp",), ("replicate",)) and shape == (2, 4)
    plain = load_config({"train_batch_size": 8})
    assert plan_data_parallel(plain, None, (), 8, 0) == (DataParallelDims(("dp",), ()), None)


def test_bad_mics_shard_sizes_are_rejected_with_the_key() -> None:
    with pytest.raises(ZeroConfigError, match="mics_shard_size"):
        load_config({"train_batch_size": 8, "zero_optimization": {"mics_shard_size": 0}})
    config = load_config({"train_batch_size": 8, "zero_optimization": {"mics_shard_size": 3}})
    with pytest.raises(
        ZeroConfigError, match=r"divisor of the world size 8 \(one of \[1, 2, 4, 8\]\), received 3"
    ):
        plan_data_parallel(config, None, (), 8, 0)


def test_replicate_dims_must_be_other_mesh_dims(world_of_one: None) -> None:
    mesh = init_mesh((1, 1, 1), ("node", "dp", "sp"))
    config = load_config({"train_batch_size": 1})
    dims, shape = plan_data_parallel(config, mesh, ["node"], 1, 0)
    assert dims == DataParallelDims(("dp", "sp"), ("node",)) and shape is None
    assert dims.in_mesh_order(mesh) == ("node", "dp", "sp")
    with pytest.raises(
        ZeroConfigError, match=r"'replicate_dims' expected distinct dims .* received \('sp',\)"
    ):
        plan_data_parallel(config, mesh, ("sp",), 1, 0)


@pytest.mark.multirank
def test_hybrid_sharding_trains_like_one_process_and_checkpoints_cross_mesh_shapes() -> None:
    run_world("tests.zero.zero_hybrid_ranks:main", world_size=4, backend="gloo", timeout=400)


@pytest.mark.multirank
@pytest.mark.mpi
def test_hybrid_sharding_on_the_mpi_backend() -> None:
    require_mpirun()
    run_world(
        "tests.zero.zero_hybrid_ranks:main", world_size=2, backend="mpi", launcher="mpirun", timeout=400
    )
