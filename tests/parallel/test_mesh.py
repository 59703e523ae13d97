"""Tiers 2 and 3 for the device mesh: wiring in a world of one, and a live world of 4."""

from __future__ import annotations

import pytest

from commlayer import dist
from commlayer.core.errors import InvalidArgumentError
from commlayer.mesh import init_mesh
from commlayer.testing import run_world


def test_world_of_one_mesh_uses_the_default_group(world_of_one: None) -> None:
    mesh = init_mesh((1, 1), ("dp", "tp"), expert_parallel_size=1)
    assert mesh["dp"].group is dist.group.WORLD and mesh["dp", "tp"].group is dist.group.WORLD
    assert mesh.get_coordinate() == (0, 0) and mesh["ep"].size() == 1 and mesh["edp"].ranks == (0,)
    assert mesh["dp"].duplicate_group() is not dist.group.WORLD


def test_init_mesh_rejects_a_shape_that_is_not_the_world(world_of_one: None) -> None:
    with pytest.raises(
        InvalidArgumentError, match=r"init_mesh: argument 'mesh_shape' .* with 1 dims: \(1,\)"
    ):
        init_mesh((2,), ("dp",))


@pytest.mark.multirank
def test_each_group_all_reduce_sums_exactly_its_members() -> None:
    run_world("tests.parallel.mesh_ranks:main", world_size=4, backend="gloo", timeout=120)
