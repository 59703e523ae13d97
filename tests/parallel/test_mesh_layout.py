"""Tier 1 (pure logic): the mesh rank layout for every factorisation of world sizes 1 to 16."""

from __future__ import annotations

import itertools
import math

import pytest

from commlayer.core.errors import InvalidArgumentError
from commlayer.mesh import MeshLayout, factorisations

NAMES = ("pp", "dp", "sp", "tp")


def every_layout() -> list[MeshLayout]:
    """Every shape of 1-4 dims for worlds 1..16, each named by an ordered pick of NAMES, every ep."""
    layouts = []
    for world in range(1, 17):
        for ndims in range(1, 5):
            names = ("dp", "sp", "tp", "pp")[:ndims]
            for shape in factorisations(world, ndims):
                ordered = tuple(sorted(names, key=NAMES.index))
                dp = shape[ordered.index("dp")]
                layouts += [
                    MeshLayout.build(shape, ordered, world, ep) for ep in range(1, dp + 1) if dp % ep == 0
                ]
    return layouts


LAYOUTS = every_layout()


def subsets_in_mesh_order(layout: MeshLayout) -> list[tuple[str, ...]]:
    dims = layout.dim_names
    return [combo for r in range(1, len(dims) + 1) for combo in itertools.combinations(dims, r)]


def test_enumeration_covers_every_factorisation() -> None:
    assert factorisations(12, 2) == [(1, 12), (2, 6), (3, 4), (4, 3), (6, 2), (12, 1)]
    assert len(factorisations(16, 4)) == 35  # compositions of the exponent 4 into 4 parts
    shapes = {(layout.shape, layout.dim_names) for layout in LAYOUTS}
    assert len(shapes) == sum(len(factorisations(world, n)) for world in range(1, 17) for n in range(1, 5))


@pytest.mark.parametrize("world", range(1, 17))
def test_coordinates_round_trip_row_major(world: int) -> None:
    for layout in (entry for entry in LAYOUTS if entry.world_size == world):
        coordinates = [layout.coordinate(rank) for rank in range(world)]
        assert coordinates == sorted(coordinates)  # row-major: last dim fastest
        assert [layout.rank_at(c) for c in coordinates] == list(range(world))
        assert all(0 <= c < size for coordinate in coordinates for c, size in zip(coordinate, layout.shape))


@pytest.mark.parametrize("world", range(1, 17))
def test_groups_partition_the_world_along_their_dims(world: int) -> None:
    for layout in (entry for entry in LAYOUTS if entry.world_size == world):
        for dims in subsets_in_mesh_order(layout):
            groups = layout.groups(dims)
            spanned = [layout.dim_names.index(d) for d in dims]
            size = math.prod(layout.shape[axis] for axis in spanned)
            assert sorted(r for g in groups for r in g) == list(range(world)), (layout, dims)
            for members in groups:
                assert len(members) == size and list(members) == sorted(members)
                coords = [layout.coordinate(r) for r in members]
                fixed = {tuple(c for axis, c in enumerate(coord) if axis not in spanned) for coord in coords}
                assert len(fixed) == 1, (layout, dims, members)  # same coordinate off the group's dims
                along = [tuple(coord[axis] for axis in spanned) for coord in coords]
                assert along == sorted(set(along))  # group rank order == coordinate order


@pytest.mark.parametrize("world", range(1, 17))
def test_expert_groups_carve_each_dp_group(world: int) -> None:
    for layout in (entry for entry in LAYOUTS if entry.world_size == world):
        ep, dp = layout.expert_parallel_size, layout.dim_size("dp")
        dp_groups, ep_groups, edp_groups = (layout.groups((d,)) for d in ("dp", "ep", "edp"))
        assert sorted(r for g in ep_groups for r in g) == list(range(world))
        assert sorted(r for g in edp_groups for r in g) == list(range(world))
        assert all(len(g) == ep for g in ep_groups) and all(len(g) == dp // ep for g in edp_groups)
        for dp_group in dp_groups:
            mine = [g for g in ep_groups if set(g) <= set(dp_group)]
            assert [list(g) for g in mine] == [list(dp_group[i : i + ep]) for i in range(0, dp, ep)]
            replicas = [g for g in edp_groups if set(g) <= set(dp_group)]
            assert len(mine) + len(replicas) == dp // ep + ep
            # every (ep group, edp group) pair of one dp group meets in exactly one rank
            assert all(len(set(a) & set(b)) == 1 for a in mine for b in replicas)


def test_worked_example_of_the_docstring() -> None:
    layout = MeshLayout.build((4, 2), ("dp", "tp"), 8, expert_parallel_size=2)
    assert layout.groups(("tp",)) == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert layout.groups(("dp",)) == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert layout.groups(("ep",)) == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert layout.groups(("edp",)) == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert layout.coordinate(5) == (2, 1)


def test_sequence_data_parallel_group_and_creation_order() -> None:
    layout = MeshLayout.build((2, 2, 2), ("dp", "sp", "tp"), 8)
    assert layout.groups(("dp", "sp")) == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert layout.groups(("sp",)) == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert layout.eager_groups() == (("dp",), ("sp",), ("tp",), ("dp", "sp"), ("ep",), ("edp",))
    assert MeshLayout.build((4,), ("tp",), 4).eager_groups() == (("tp",),)


@pytest.mark.parametrize(
    ("shape", "names", "ep", "fragment"),
    [
        (
            (3, 2),
            ("dp", "tp"),
            1,
            "product is the world size 8; with 2 dims: (1, 8), (2, 4), (4, 2), (8, 1), received (3, 2)",
        ),
        ((0, 8), ("dp", "tp"), 1, "a non-empty sequence of positive ints"),
        ((8,), ("dp", "tp"), 1, "1 distinct identifiers"),
        ((4, 2), ("dp", "dp"), 1, "2 distinct identifiers"),
        ((4, 2), ("dp", "ep"), 1, "names other than 'ep'/'edp'"),
        ((4, 2), ("dp", "tp"), 3, "a divisor of the 'dp' size 4: one of [1, 2, 4], received 3"),
        ((8,), ("tp",), 2, "has no 'dp' dim to carve experts from"),
    ],
)
def test_invalid_layouts_name_the_valid_values(
    shape: tuple[int, ...], names: tuple[str, ...], ep: int, fragment: str
) -> None:
    with pytest.raises(InvalidArgumentError, match="init_mesh") as raised:
        MeshLayout.build(shape, names, 8, ep, rank=3)
    assert fragment in str(raised.value) and "(rank 3)" in str(raised.value)


@pytest.mark.parametrize(
    ("dims", "fragment"),
    [
        (("xx",), "distinct names among ('dp', 'sp', 'ep', 'edp')"),
        (("sp", "dp"), "dims in mesh order, i.e. ('dp', 'sp')"),
        (("dp", "dp"), "distinct names"),
        (("ep", "sp"), "'ep' or 'edp' on its own"),
    ],
)
def test_invalid_dim_keys_name_the_valid_values(dims: tuple[str, ...], fragment: str) -> None:
    layout = MeshLayout.build((2, 2), ("dp", "sp"), 4)
    with pytest.raises(InvalidArgumentError, match="Mesh.__getitem__") as raised:
        layout.check_dims(dims, rank=1)
    assert fragment in str(raised.value)
