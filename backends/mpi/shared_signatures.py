"""The mismatch check's shared slots in an MPI shared window, for a communicator on one host.

The exchange itself is :mod:`commlayer.contract.mismatch.shared_slots` (its docstring has the
protocol, speculation included); here MPI allocates the slots (``MPI.Win.Allocate_shared``: MPI
frees them, no /dev/shm name, nothing left behind by a killed job) and the waits tell the mpi
backend's watchdog and exit path about themselves: no MPI call is in progress during such a wait,
so the watchdog of synchronous calls leaves it to raise its typed error (:mod:`.bounded_waits`);
a wait that gave up is remembered as abandoned (a peer that read this rank's signature may be
inside the data call), so the job ends with MPI_Abort at exit instead of hanging in MPI_Finalize.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

from commlayer.backends.mpi import runtime
from commlayer.backends.mpi.bounded_waits import raising_wait
from commlayer.contract.mismatch.shared_slots import (
    WORDS,
    SharedSignatures,
    WaitHooks,
    shared_memory_is_ordered,
)

__all__ = ["open_shared_signatures"]

_SLOTS = 2
# Open MPI asks its osc/ucx component first for every window; where UCX has no usable device it
# prints this (and a blank line) to stderr, then osc/sm serves the window as asked.
_UCX_QUERY_NOISE = "OSC UCX component priority set inside component query failed"


def _gave_up(error: Exception) -> None:
    runtime.abandon(f"{type(error).__name__}: {error}", lambda: True)


HOOKS = WaitHooks(waiting=raising_wait, gave_up=_gave_up)


def open_shared_signatures(comm: Any, mpi: Any) -> SharedSignatures | None:
    """The shared slots of ``comm``'s ranks (collective), or None: ranks on several hosts, or no TSO.

    Every rank of ``comm`` must call it; all of them get None or all a window.
    """
    if not shared_memory_is_ordered():
        return None
    node = comm.Split_type(mpi.COMM_TYPE_SHARED)
    try:
        if node.Get_size() != comm.Get_size():  # the same answer on every rank: a partition of comm
            return None
        window = _allocate_quietly(mpi, comm)
    finally:
        node.Free()
    buffers = [window.Shared_query(rank)[0] for rank in range(comm.Get_size())]
    slots = [memoryview(buffer).cast("B").cast("q") for buffer in buffers]
    mine = slots[comm.Get_rank()]
    for index in range(len(mine)):
        mine[index] = 0  # MPI does not zero the window; sequences start at 1
    comm.Barrier()  # every slot is zero before any rank publishes its first check
    addresses = [buffer.address for buffer in buffers]
    return SharedSignatures(slots, comm.Get_rank(), window.Free, addresses, HOOKS)


def _allocate_quietly(mpi: Any, comm: Any) -> Any:
    """``Win.Allocate_shared`` of the slots, without Open MPI's osc/ucx query error on stderr (every
    group's creation would print it); anything else written meanwhile is passed on."""
    sys.stderr.flush()
    with tempfile.TemporaryFile() as captured:
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            return mpi.Win.Allocate_shared(_SLOTS * WORDS * 8, 8, comm=comm)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
            kept = [line for line in lines if line.strip() and _UCX_QUERY_NOISE not in line]
            sys.stderr.write("".join(kept))
