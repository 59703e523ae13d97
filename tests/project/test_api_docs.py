"""Documentation: every public name of commlayer.dist, the Backend contract, the mesh and the ZeRO
engine carry docstrings (names commlayer re-exports from torch are documented by torch)."""

from __future__ import annotations

import inspect

import pytest
import torch.distributed as torch_dist

from commlayer import dist
from commlayer.contract.backend import Backend
from commlayer.mesh import Mesh, MeshLayout, init_mesh
from commlayer.zero import ZeroEngine


def _torchs_own(name: str, value: object) -> bool:
    module = getattr(value, "__module__", "") or ""
    return getattr(torch_dist, name, None) is value or not module.startswith("commlayer")


def _undocumented(owner: type) -> list[str]:
    return [
        name
        for name, member in vars(owner).items()
        if not name.startswith("_")
        and (inspect.isfunction(member) or isinstance(member, (classmethod, property)))
        and not (inspect.getdoc(member.__func__ if isinstance(member, classmethod) else member) or "")
    ]


def test_every_public_facade_name_has_a_docstring() -> None:
    missing = [
        name
        for name in dist.__all__
        if not _torchs_own(name, getattr(dist, name))
        and not (inspect.getdoc(getattr(dist, name)) or "").strip()
    ]
    assert missing == []


@pytest.mark.parametrize("name", ["all_reduce", "broadcast", "all_gather_into_tensor", "send", "irecv"])
def test_collectives_document_args_returns_raises_and_an_example(name: str) -> None:
    text = inspect.getdoc(getattr(dist, name)) or ""
    assert all(section in text for section in ("Args:", "Returns:", "Example::")), text
    parameters = inspect.signature(getattr(dist, name)).parameters
    assert all(f"{parameter} (" in text for parameter in parameters), text


@pytest.mark.parametrize("owner", [Backend, Mesh, MeshLayout, ZeroEngine])
def test_contract_mesh_and_engine_document_every_public_member(owner: type) -> None:
    assert inspect.getdoc(owner) and _undocumented(owner) == []


def test_mesh_entry_point_is_documented() -> None:
    text = inspect.getdoc(init_mesh) or ""
    assert "Args:" in text and "Returns:" in text, text
