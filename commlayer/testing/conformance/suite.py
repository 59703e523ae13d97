"""The conformance suite: every facade op, dtype and ReduceOp, on WORLD and a subgroup, sync and
async, with exact checks. One world runs all of it (spawning per case would not fit in CI).

Run it on any installed backend with ``commlayer test-backend NAME -n 3``, or from a test::

    run_world("commlayer.testing.conformance:main", world_size=3, backend="gloo")

Every check is recorded as one cell of a :class:`~.certificate.Certificate` instead of stopping the
run, so a broken backend gets a table of what broke. A combination the backend does not declare
(``Capabilities``) must raise UnsupportedError before communicating; it is then "declared
unsupported". Layout (world of 4): the subgroup is global ranks [1, 2, 3], so global rank 0 is the
non-member that must get None back and keep its tensors; a world of 2 uses [0, 1] in a new group,
so group translation is still exercised.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from commlayer import dist
from commlayer.contract.backend import Backend
from commlayer.testing.conformance import checks as _checks
from commlayer.testing.conformance import hook_checks as _hook_checks
from commlayer.testing.conformance import uneven_checks as _uneven_checks
from commlayer.testing.conformance.case import Case
from commlayer.testing.conformance.certificate import Certificate
from commlayer.testing.conformance.window_checks import check_windows

__all__ = ["main", "run_suite"]


def run_suite(
    backend: Backend | None = None,
    device: torch.device | None = None,
    save_to: Path | None = None,
    extensions: bool = False,
    subgroup: bool = True,
) -> Certificate:
    """Run every check on this rank of an initialised world and return this rank's verdicts.

    Args:
        backend: the backend under test; by default the world's primary backend.
        device: where tensors live; by default CPU if the backend takes it, else this rank's GPU.
        save_to: a file the verdicts are rewritten to after every check, so a launcher can show
            what ran even if a hung world has to be stopped.
        extensions: also check the extensions beyond torch.distributed: hooks, per-call
            timeouts and one-sided windows (``commlayer test-backend NAME --extensions``).
        subgroup: also run every check on a subgroup (all ranks but rank 0 from 3 ranks on);
            False checks the world alone, e.g. where only the transport between hosts is new.

    Returns:
        This rank's :class:`~.certificate.Certificate` (merge the ranks' to get the whole table).
    """
    world, me = dist.get_world_size(), dist.get_rank()
    backend = backend if backend is not None else dist.group.WORLD.primary_backend
    device = device if device is not None else _device(backend.capabilities.devices)
    certificate = Certificate(backend.name, world)
    groups: list[tuple[Any, list[int]]] = [(None, list(range(world)))]
    if subgroup:
        sub_ranks = list(range(1, world)) if world > 2 else list(range(world))
        groups.append((dist.new_group(sub_ranks), sub_ranks))
    for group, members in groups:
        for async_op in (False, True):
            case = Case(group, members, me, async_op, device, backend, certificate)
            checks = (*_checks.CHECKS, *_uneven_checks.CHECKS)
            extra = (*_hook_checks.CHECKS, check_windows) if extensions else ()
            for check in (*checks, *extra):
                check(case)
                if save_to is not None:
                    certificate.write(save_to)
    dist.barrier()
    return certificate


def main(results_dir: str = "", *options: str) -> None:
    """Rank body: run the suite, save the verdicts under ``results_dir``, fail if any cell failed.
    ``options`` may name ``extensions`` to check hooks, per-call timeouts and windows too, and
    ``world-only`` to skip the subgroup pass."""
    rank = dist.get_rank()
    save_to = Path(results_dir) / f"rank{rank}.certificate.json" if results_dir else None
    certificate = run_suite(
        save_to=save_to, extensions="extensions" in options, subgroup="world-only" not in options
    )
    failures = certificate.failures()
    if failures:
        listed = "\n".join(f"  {v.cell.label}: {v.detail}" for v in failures)
        raise AssertionError(f"conformance: {len(failures)} cells failed on rank {rank}:\n{listed}")


def _device(devices: frozenset[str]) -> torch.device:
    if "cpu" in devices:
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)
