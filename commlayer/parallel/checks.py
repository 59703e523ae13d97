"""Argument checks shared by the parallel layers: all run before any communication."""

from __future__ import annotations

from commlayer.core.errors import InvalidArgumentError, invalid_argument
from commlayer.dist import ProcessGroup
from commlayer.mesh import Mesh

__all__ = ["mesh_dim_group", "require_divisible"]


def mesh_dim_group(op: str, mesh: object, dim: str, rank: int) -> ProcessGroup:
    """The group of ``mesh[dim]``, or a clear error naming ``dim`` (or ``mesh``) when it has none."""
    if not isinstance(mesh, Mesh):
        raise invalid_argument(op, "mesh", "a commlayer.mesh.Mesh", type(mesh).__name__, rank)
    valid = mesh.layout.valid_dims() if "dp" in mesh.mesh_dim_names else mesh.mesh_dim_names
    if dim not in valid:
        raise invalid_argument(
            op, f"{dim!r} dim of mesh", f"a dim of the mesh, one of {valid}", repr(dim), rank
        )
    return mesh[dim].group


def require_divisible(op: str, arg: str, value: int, divisor: int, what: str, rank: int) -> None:
    """Raise unless ``value`` (the size of ``arg``) is a multiple of ``divisor`` (``what``)."""
    if value % divisor:
        raise invalid_argument(
            op, arg, f"a size divisible by {what} ({divisor})", value, rank, InvalidArgumentError
        )
