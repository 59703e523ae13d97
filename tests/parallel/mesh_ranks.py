"""Live world-4 mesh checks: each group's all_reduce sums exactly its members.

Run by tests/parallel/test_mesh.py as ``run_world("tests.parallel.mesh_ranks:main", 4)``. Every rank
contributes ``2**rank`` (plus a second, rank-distinct element), so the sum is the bit mask of the
ranks that took part: a group reducing over one rank too many or too few gives a different mask.
The expected members are written out by hand, not taken from the layout code under test.
"""

from __future__ import annotations

import pytest
import torch

from commlayer import dist
from commlayer.core.errors import InvalidArgumentError
from commlayer.mesh import Mesh, init_mesh

# (2, 2) mesh ("dp", "sp"), ep=2: rank = 2 * dp + sp.
DP_SP = {
    "dp": [[0, 2], [1, 3]],
    "sp": [[0, 1], [2, 3]],
    ("dp", "sp"): [[0, 1, 2, 3]],
    "ep": [[0, 2], [1, 3]],
    "edp": [[0], [1], [2], [3]],
}
# (4,) mesh ("dp",), ep=2.
DP_ONLY = {"dp": [[0, 1, 2, 3]], "ep": [[0, 1], [2, 3]], "edp": [[0, 2], [1, 3]]}
# (1, 2, 2) mesh ("pp", "dp", "tp"): rank = 2 * dp + tp; flattened combos are created lazily.
PP_DP_TP = {
    "pp": [[0], [1], [2], [3]],
    "tp": [[0, 1], [2, 3]],
    ("dp", "tp"): [[0, 1, 2, 3]],
    ("pp", "tp"): [[0, 1], [2, 3]],
}


def main() -> None:
    rank = dist.get_rank()
    assert dist.get_world_size() == 4
    check_mesh(init_mesh((2, 2), ("dp", "sp"), expert_parallel_size=2), DP_SP, rank)
    check_coordinates_of_dp_sp(init_mesh((2, 2), ("dp", "sp")), rank)
    check_mesh(init_mesh((4,), ("dp",), expert_parallel_size=2), DP_ONLY, rank)
    check_mesh(init_mesh((1, 2, 2), ("pp", "dp", "tp")), PP_DP_TP, rank)
    check_duplicate_group(init_mesh((2, 2), ("dp", "tp")), rank)
    check_bad_input_fails_without_communicating(rank)


def check_mesh(mesh: Mesh, expected: dict, rank: int) -> None:
    for key, groups in expected.items():
        members = next(group for group in groups if rank in group)
        sub = mesh[key]
        assert list(sub.ranks) == members, (key, sub.ranks, members)
        assert sub.size() == len(members) and sub.get_local_rank() == members.index(rank)
        assert mask_of(sub.group) == sum(2**r for r in members), (key, members)


def mask_of(group: object) -> int:
    rank = dist.get_rank()
    values = torch.tensor([2.0**rank, 1000.0 + rank], dtype=torch.float64)
    work = dist.all_reduce(values, group=group, async_op=True)
    work.wait()
    mask = int(values[0].item())
    members = [r for r in range(4) if mask >> r & 1]
    assert values[1].item() == sum(1000.0 + r for r in members)
    return mask


def check_coordinates_of_dp_sp(mesh: Mesh, rank: int) -> None:
    dp, sp = divmod(rank, 2)
    assert mesh.get_coordinate() == (dp, sp) and mesh.shape == (2, 2) and mesh.size() == 4
    assert mesh.get_local_rank("dp") == dp and mesh.get_local_rank("sp") == sp
    flat = mesh["dp", "sp"]
    assert flat.get_coordinate() == (dp, sp) and flat.get_local_rank() == rank and flat.size("sp") == 2
    assert mesh["dp"].get_coordinate() == (dp,) and mesh.get_group("sp") is mesh["sp"].group


def check_duplicate_group(mesh: Mesh, rank: int) -> None:
    original, copy = mesh["dp"].group, mesh["dp"].duplicate_group()
    assert copy is not original and copy.ranks == original.ranks == (rank % 2, rank % 2 + 2)
    assert mask_of(copy) == mask_of(original) == 2 ** (rank % 2) + 2 ** (rank % 2 + 2)


def check_bad_input_fails_without_communicating(rank: int) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"product is the world size 4.*\(rank {rank}\)"):
        init_mesh((3,), ("dp",))
    with pytest.raises(InvalidArgumentError, match="divisor of the 'dp' size 2"):
        init_mesh((2, 2), ("dp", "tp"), expert_parallel_size=4)
    mesh = init_mesh((2, 2), ("dp", "tp"))
    with pytest.raises(InvalidArgumentError, match=r"distinct names among \('dp', 'tp', 'ep', 'edp'\)"):
        mesh["sp"]
    with pytest.raises(InvalidArgumentError, match=r"names among \('tp',\)"):
        mesh["tp"]["dp"]
    assert mask_of(None) == 15  # the world still works: no rank was left inside a collective
