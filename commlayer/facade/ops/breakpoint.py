"""``dist.breakpoint``: stop one rank in pdb while every other rank waits at a barrier."""

from __future__ import annotations

import pdb  # noqa: T100 - dist.breakpoint is a debugger entry point by design
import sys
from datetime import timedelta

from commlayer.core.boundary import user_facing
from commlayer.facade.groups.queries import get_rank
from commlayer.facade.ops.tensor_lists import barrier

__all__ = ["breakpoint"]


# Calls per source line, for ``skip``: process-wide like the breakpoints themselves.
_calls_seen: dict[tuple[str, int], int] = {}


class _TerminalPdb(pdb.Pdb):
    """A pdb reading the terminal, not the launcher's pipe that a rank's stdin usually is."""

    def interaction(self, *args: object, **kwargs: object) -> None:
        saved = sys.stdin
        try:
            with open("/dev/stdin") as sys.stdin:
                super().interaction(*args, **kwargs)
        finally:
            sys.stdin = saved


@user_facing
def breakpoint(rank: int = 0, skip: int = 0, timeout_s: float | None = 3600) -> None:
    """Break into pdb on ``rank`` only; the others wait in a barrier of up to ``timeout_s`` seconds.

    The first ``skip`` calls from the same line return at once (on every rank alike).
    """
    caller = sys._getframe(1)
    where = (caller.f_code.co_filename, caller.f_lineno)
    _calls_seen[where] = _calls_seen.get(where, 0) + 1
    if _calls_seen[where] <= skip:
        return
    if get_rank() == rank:
        debugger = _TerminalPdb()
        debugger.message(f"Type 'up' to get to the frame that called dist.breakpoint(rank={rank})")
        debugger.set_trace(caller)
    work = barrier(async_op=True)
    if work is not None:
        work.wait(None if timeout_s is None else timedelta(seconds=timeout_s))
