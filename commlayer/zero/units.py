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

With ``coalesce_numel`` > 0, consecutive units that are whole children of one ``nn.ModuleList``
or ``nn.Sequential`` (the blocks) are then joined while together they hold at most that many
parameters: one unit of several modules, gathered when the first starts and freed when the last
ends, so a step makes fewer, larger collectives. With ``coalesce_numel=5e7`` the example's 24
blocks become 8 units of 3 (37.8M each), 12 units in all.
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
    modules: tuple[nn.Module, ...]  # one, or consecutive siblings run in this order
    name: str  # the module's qualified name ("" for the root; "blocks.0-2" for joined ones)
    params: tuple[int, ...]  # indices into the engine's parameter list


def plan_units(
    model: nn.Module,
    params: Sequence[torch.Tensor],
    max_numel: int,
    min_numel: int,
    coalesce_numel: int = 0,
) -> list[UnitPlan]:
    """The root unit first, then the other units in pre-order (see the module docstring)."""
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
            _add(units, claimed, UnitPlan((module,), name, tuple(subtree)))
            return
        own = indices(module, recurse=False)
        if is_root or isinstance(module, _CONTAINERS):
            root.extend(own)
            claimed.update(own)
        else:
            _add(units, claimed, UnitPlan((module,), name, tuple(own)))
        for child_name, child in module.named_children():
            visit(child, f"{name}.{child_name}" if name else child_name, False)

    visit(model, "", True)
    small = [unit for unit in units if _numel(params, unit.params) < min_numel]
    for unit in small:
        root.extend(unit.params)
    kept = [unit for unit in units if unit not in small]
    if coalesce_numel > 0:
        kept = _coalesce(model, params, kept, coalesce_numel)
    return [UnitPlan((model,), "", tuple(sorted(root))), *kept]


def _coalesce(
    model: nn.Module, params: Sequence[torch.Tensor], units: list[UnitPlan], limit: int
) -> list[UnitPlan]:
    """Join runs of units that are whole, consecutive children of one ModuleList or Sequential."""
    place = _sibling_places(model)
    # Per run: its units, their parameters' numel, and where its last unit sits (None: not joinable).
    runs: list[tuple[list[UnitPlan], int, tuple[int, int] | None]] = []
    for unit in units:
        numel = _numel(params, unit.params)
        spot = place.get(id(unit.modules[0])) if _whole(unit, numel) else None
        if runs and spot is not None:
            run, total, last = runs[-1]
            if last == (spot[0], spot[1] - 1) and total + numel <= limit:
                runs[-1] = (run + [unit], total + numel, spot)
                continue
        runs.append(([unit], numel, spot))
    return [run[0] if len(run) == 1 else _joined(run) for run, _, _ in runs]


def _sibling_places(model: nn.Module) -> dict[int, tuple[int, int]]:
    """id(child) -> (id(parent), position) for the children of every ModuleList and Sequential."""
    return {
        id(child): (id(parent), position)
        for parent in model.modules()
        if isinstance(parent, (nn.ModuleList, nn.Sequential))
        for position, child in enumerate(parent.children())
    }


def _whole(unit: UnitPlan, numel: int) -> bool:
    """Whether the unit holds all of its module's parameters (not a split module's own ones)."""
    return sum(p.numel() for p in unit.modules[0].parameters()) == numel


def _joined(run: list[UnitPlan]) -> UnitPlan:
    suffix = run[-1].name.rsplit(".", 1)[-1]
    params = tuple(i for unit in run for i in unit.params)
    return UnitPlan(tuple(m for unit in run for m in unit.modules), f"{run[0].name}-{suffix}", params)


def _add(units: list[UnitPlan], claimed: set[int], unit: UnitPlan) -> None:
    if unit.params:
        units.append(unit)
        claimed.update(unit.params)


def _numel(params: Sequence[torch.Tensor], indices: Sequence[int]) -> int:
    return sum(params[i].numel() for i in indices)
