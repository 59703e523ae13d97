"""A randomised, exactly checked workout of one window: thousands of puts, gets and signals.

Every rank draws the same schedule from one seed and simulates all of it on a model of every
window, so each result is known exactly. To keep the outcome independent of timing, member ``o``
writes only slab ``o`` (``SLAB`` elements) of each window and reads back only its own slabs; any
op may be async. A round ends with a signal from every member to every member; each member then
consumes all signals it was sent and checks each slab against the model (a signal orders the
puts before it), and a fence opens the next round. At the end every rank checks its whole window.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

import commlayer
from commlayer import dist
from commlayer.core.work import Work

__all__ = ["SLAB", "StressReport", "run_window_stress"]

SLAB = 32
_ROUNDS = 20


@dataclass(frozen=True)
class StressReport:
    """What one rank checked."""

    puts: int
    gets: int
    signals: int
    checked_elements: int


def run_window_stress(
    ops: int = 2000, seed: int = 0, group: object = None, async_share: float = 0.3
) -> StressReport:
    """Run ``ops`` random window ops over ``group`` (all members' together), checking every result.

    Args:
        ops: the number of random puts, gets and signals, over all members.
        seed: the schedule's seed (equal on every member).
        group: the window's group (default WORLD).
        async_share: the fraction of ops issued with ``async_op=True``.

    Returns:
        This rank's counts; raises AssertionError on the first wrong element.
    """
    members = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    me = dist.get_rank()
    model = {t: torch.full((len(members) * SLAB,), -1 - t, dtype=torch.int64) for t in members}
    win = commlayer.window(model[me].clone(), group=group)
    assert win is not None
    rng = random.Random(seed)
    counts = {"put": 0, "get": 0, "signal": 0}
    per_round = -(-ops // (_ROUNDS * len(members)))  # rounded up: at least ``ops`` in all
    checked = 0
    for _ in range(_ROUNDS):
        sent = {(o, t): 1 for o in members for t in members}  # the round's closing signals
        pending: list[tuple[Work, torch.Tensor | None, torch.Tensor | None]] = []
        for origin in members:
            for _ in range(per_round):
                kind, target, action = _draw(rng, members, origin, model)
                async_op = rng.random() < async_share
                sent[(origin, target)] += kind == "signal"
                if origin == me:
                    counts[kind] += 1
                    pending.append(_issue(win, kind, target, action, async_op))
        for work, out, expected in pending:
            if work is not None:
                work.wait()
            if out is not None:
                _assert_exact(out, expected, f"get on rank {me}")
                checked += out.numel()
        for target in members:
            win.signal(target)
        for origin in members:
            for _ in range(sent[(origin, me)]):
                win.wait_signal(origin)
        for index, origin in enumerate(members):
            slab = slice(index * SLAB, (index + 1) * SLAB)
            _assert_exact(
                win.tensor[slab], model[me][slab], f"slab of rank {origin} after its signal, rank {me}"
            )
            checked += SLAB
        win.fence()
    _assert_exact(win.tensor, model[me], f"final window of rank {me}")
    win.free()
    return StressReport(counts["put"], counts["get"], counts["signal"], checked + model[me].numel())


def _draw(
    rng: random.Random, members: list[int], origin: int, model: dict[int, torch.Tensor]
) -> tuple[str, int, tuple[int, torch.Tensor] | None]:
    """One op of ``origin``: applied to the model at once (puts), or the expected data (gets)."""
    kind = rng.choices(("put", "get", "signal"), weights=(5, 3, 2))[0]
    target = rng.choice(members)
    if kind == "signal":
        return kind, target, None
    base = members.index(origin) * SLAB
    offset = rng.randrange(SLAB)
    length = rng.randint(1, SLAB - offset)
    span = slice(base + offset, base + offset + length)
    if kind == "put":
        data = torch.arange(length, dtype=torch.int64) + rng.randrange(1 << 40)
        model[target][span] = data
        return kind, target, (base + offset, data)
    return kind, target, (base + offset, model[target][span].clone())


def _issue(
    win: commlayer.Window, kind: str, target: int, action: tuple[int, torch.Tensor] | None, async_op: bool
) -> tuple[Work, torch.Tensor | None, torch.Tensor | None]:
    if kind == "signal":
        return win.signal(target, async_op=async_op), None, None
    assert action is not None
    offset, data = action
    if kind == "put":
        return win.put(data, target, offset, async_op=async_op), None, None
    out = torch.zeros_like(data)
    return win.get(out, target, offset, async_op=async_op), out, data


def _assert_exact(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    if not torch.equal(actual, expected):
        wrong = (actual != expected).nonzero().flatten()[:4].tolist()
        raise AssertionError(
            f"window stress: {what}: elements {wrong} are {actual[wrong].tolist()}, expected {expected[wrong].tolist()}"
        )
