"""Stage 3: which modules are gathered and freed as one unit. Pure: looks only at the module tree.

Walking down from the root, a module whose parameters (its own and its descendants') number at
most ``max_numel`` becomes one unit; a bigger one becomes a unit of its own direct parameters
and its children are visited in turn. Containers (ModuleList, ModuleDict, ...) are never units,
because nothing calls their forward. Units smaller than ``min_numel`` join the root unit, as do
parameters reachable from several modules (tied weights): the root unit is gathered when the
root's forward starts and stays gathered until its gradients are done.

Example, a GPT with 24 blocks of 12.6M parameters, 32.8M-parameter token embedding and head,
``max_numel=5e7``, ``min_numel=1e5``: the units are the root (holding the final LayerNorm,
whose 2k parameters are below ``min_numel``), ``tok``, ``pos`` (1M), each of the 24 blocks, and
``head``: 28 units, in that (pre-)order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["UnitPlan", "plan_units"]

_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)


@dataclass(frozen=True)
class UnitPlan:
    module: nn.Module
    name: str  # the module's qualified name ("" for the root)
    params: tuple[int, ...]  # indices into the engine's parameter list


def plan_units(
    model: nn.Module, params: Sequence[torch.Tensor], max_numel: int, min_numel: int
) -> list[UnitPlan]:
    """The root unit first, then the other units in pre-order."""
    index_of = {id(p): i for i, p in enumerate(params)}
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    shared = {key for key, count in uses.items() if count > 1}
    root: list[int] = [index_of[key] for key in index_of if key in shared]
    units: list[UnitPlan] = []
    claimed: set[int] = set(root)

    def indices(module: nn.Module, recurse: bool) -> list[int]:
        found = [index_of[id(p)] for p in module.parameters(recurse=recurse) if id(p) not in shared]
        return [i for i in found if i not in claimed]

    def visit(module: nn.Module, name: str, is_root: bool) -> None:
        subtree = indices(module, recurse=True)
        if not is_root and not isinstance(module, _CONTAINERS) and _numel(params, subtree) <= max_numel:
            _add(units, claimed, UnitPlan(module, name, tuple(subtree)))
            return
        own = indices(module, recurse=False)
        if is_root or isinstance(module, _CONTAINERS):
            root.extend(own)
            claimed.update(own)
        else:
            _add(units, claimed, UnitPlan(module, name, tuple(own)))
        for child_name, child in module.named_children():
            visit(child, f"{name}.{child_name}" if name else child_name, False)

    visit(model, "", True)
    small = [unit for unit in units if _numel(params, unit.params) < min_numel]
    for unit in small:
        root.extend(unit.params)
    kept = [unit for unit in units if unit not in small]
    return [UnitPlan(model, "", tuple(sorted(root))), *kept]


def _add(units: list[UnitPlan], claimed: set[int], unit: UnitPlan) -> None:
    if unit.params:
        units.append(unit)
        claimed.update(unit.params)


def _numel(params: Sequence[torch.Tensor], indices: Sequence[int]) -> int:
    return sum(params[i].numel() for i in indices)
