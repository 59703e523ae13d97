"""Device meshes: data, sequence, expert and tensor parallel groups over ``commlayer.dist``.

``init_mesh((2, 2), ("dp", "sp"))`` lays the world out as a grid and creates its groups;
``mesh["dp"]``, ``mesh["dp", "sp"]``, ``mesh["ep"]`` give sub-meshes with ``.group``. The pure
rank layout lives in :class:`MeshLayout` (documented there with a worked example).
"""

from __future__ import annotations

from commlayer.mesh.layout import EXPERT_DIMS, MeshLayout, factorisations, flat_name
from commlayer.mesh.mesh import Mesh, init_mesh

__all__ = ["EXPERT_DIMS", "Mesh", "MeshLayout", "factorisations", "flat_name", "init_mesh"]
