"""Rank bodies of the window tests (tests/backends/test_windows.py)."""

from __future__ import annotations

import torch

from commlayer import dist
from commlayer.testing.conformance import Case, Certificate
from commlayer.testing.conformance.window_checks import check_windows
from commlayer.testing.conformance.window_stress import run_window_stress


def conformance() -> None:
    """The kit's window checks on WORLD and a subgroup, sync and async; fail on any failed cell."""
    world, me = dist.get_world_size(), dist.get_rank()
    backend = dist.group.WORLD.primary_backend
    certificate = Certificate(backend.name, world)
    sub_ranks = list(range(1, world)) if world > 2 else list(range(world))
    subgroup = dist.new_group(sub_ranks)
    for group, members in ((None, list(range(world))), (subgroup, sub_ranks)):
        for async_op in (False, True):
            check_windows(Case(group, members, me, async_op, torch.device("cpu"), backend, certificate))
    failures = certificate.failures()
    assert not failures, "\n".join(f"{v.cell.label}: {v.detail}" for v in failures)


def stress(ops: str = "2000") -> None:
    """2,000 random puts, gets and signals over WORLD, every result and the final windows exact."""
    report = run_window_stress(int(ops), seed=7)
    total = torch.tensor([report.puts + report.gets + report.signals])
    dist.all_reduce(total)
    assert total.item() >= int(ops), f"only {total.item()} ops ran"
    print(f"window stress: rank {dist.get_rank()}: {report}; {total.item()} ops in all", flush=True)


def all_checks() -> None:
    """The conformance checks, then the stress run, in one world (mpirun worlds start slowly)."""
    conformance()
    stress()
