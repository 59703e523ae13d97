"""Rank bodies of the window tests (tests/backends/test_windows.py)."""

from __future__ import annotations

import torch

from commlayer import dist
from commlayer.testing.conformance import Case, Certificate
from commlayer.testing.conformance.window_checks import check_windows
from commlayer.testing.conformance.window_stress import run_window_stress


def _groups() -> list[tuple[object, list[int]]]:
    """WORLD, its ranks but the first, and a pair: in a world of 4, windows of 4, 3 and 2 ranks."""
    world = dist.get_world_size()
    rest = list(range(1, world)) if world > 2 else list(range(world))
    pair = [0, world - 1]
    return [(None, list(range(world))), (dist.new_group(rest), rest), (dist.new_group(pair), pair)]


def conformance() -> None:
    """The kit's window checks on WORLD and two subgroups, sync and async; fail on any failed cell."""
    world, me = dist.get_world_size(), dist.get_rank()
    backend = dist.group.WORLD.primary_backend
    certificate = Certificate(backend.name, world)
    for group, members in _groups():
        for async_op in (False, True):
            check_windows(Case(group, members, me, async_op, torch.device("cpu"), backend, certificate))
    failures = certificate.failures()
    assert not failures, "\n".join(f"{v.cell.label}: {v.detail}" for v in failures)


def stress(ops: str = "2000") -> None:
    """2,000 random puts, gets and signals over WORLD, then over a pair; every result exact."""
    world = dist.get_world_size()
    _stress_on(None, list(range(world)), int(ops))
    if world > 2:
        pair = [0, world - 1]
        _stress_on(dist.new_group(pair), pair, int(ops))
    dist.barrier()  # a rank that leaves early would count as failed to the ranks still working


def _stress_on(group: object, members: list[int], ops: int) -> None:
    if dist.get_rank() not in members:
        return
    report = run_window_stress(ops, seed=7 + len(members), group=group)
    total = torch.tensor([report.puts + report.gets + report.signals])
    dist.all_reduce(total, group=group)
    assert total.item() >= ops, f"only {total.item()} ops ran on {members}"
    print(f"window stress on {members}: rank {dist.get_rank()}: {report}; {total.item()} ops", flush=True)


def all_checks() -> None:
    """The conformance checks, then the stress runs, in one world."""
    conformance()
    stress()
