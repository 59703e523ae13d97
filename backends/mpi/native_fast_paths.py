"""Ordered mode's fast paths in C (csrc/mpi/fast_paths.cpp): the plain synchronous call, at
the speed of MPI's own C function.

A planned collective on CPU tensors, called synchronously with nothing queued, is most calls of
a training loop or a benchmark. For those the C fast path does what :mod:`.fast_paths`' Python
fast path does -- the mismatch check through the shared window, the flight-recorder entry, the
watchdog's stamps, the blocking call without the GIL -- but calls the MPI library's C function
itself instead of mpi4py's method, with the handles mpi4py already holds. Every other call (async,
behind queued ones, CUDA, a count over INT_MAX, a peer late or disagreeing) goes to the Python
fast path or the Python check, so every rule stays written once, in Python.

Built only where it can be exact: the extension is built, ``$COMMLAYER_C_FAST_PATHS`` is not ``0``,
the mismatch check (when on) exchanges through shared memory, exactly one MPI library is mapped
into the process and exports the call, and its handles are ints or pointers (MPICH's or Open
MPI's ABI), told by mpi4py's own ``_sizeof``.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from typing import Any

from commlayer.backends.mpi.fast_path_context import MpiFastPathContext
from commlayer.contract.fast_paths import FastPath, c_fast_paths_enabled
from commlayer.core.flight_recorder import Recording

try:
    from commlayer.backends.mpi import _fast_paths as _extension  # csrc/mpi/fast_paths.cpp
except ImportError:  # a checkout laid out without building: the Python fast paths serve
    _extension = None

__all__ = ["c_fast_path", "native_enabled"]

# op -> (the MPI function, the index of the tensor the recorder enters)
_CALLS = {
    "all_reduce": ("MPI_Allreduce", 0),
    "broadcast": ("MPI_Bcast", 0),
    "all_gather_into_tensor": ("MPI_Allgather", 0),
    "reduce_scatter_tensor": ("MPI_Reduce_scatter_block", 1),
    "all_to_all_single": ("MPI_Alltoall", 1),
}
# Polls of a late peer's slot, spinning, before the fast path yields the CPU between polls: ~50 us,
# well above the 1-4 us ranks of one host wait for each other at 1-2 MiB (benchmarks/RESULTS.md).
_SPIN_POLLS = 2048
_SHARED_CPU_SPIN_POLLS = 16
# The ops whose input MPI never writes (on separate buffers): the fast path may speculate on them.
_INPUT_UNWRITTEN = frozenset({"all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"})
_MPI_LIBRARY = re.compile(r"/libmpi\.so(\.\d+)*$")


def c_fast_path(
    context: MpiFastPathContext,
    op: str,
    fixed: tuple[Any, ...],
    recording: Recording,
    key: int,
    otherwise: FastPath,
) -> FastPath | None:
    """The C ``run(async_op, *tensors)`` of ``op`` whose unusual calls go to ``otherwise``; None
    where it cannot be built (see the module docstring)."""
    check, mpi = context.check, context.mpi
    if not native_enabled() or op not in _CALLS:
        return None
    if check is not None and (check.shared is None or check.shared.addresses() is None):
        return None  # the Allreduce check: Python's fast path
    functions, handle_size = _library_functions(), _handle_size(mpi)
    if functions is None or handle_size is None:
        return None
    name, payload = _CALLS[op]
    return _extension.fast_path(
        op=op,
        function=functions[name],
        handles=_handles(context, op, fixed, recording, handle_size),
        int_handles=handle_size == ctypes.sizeof(ctypes.c_int),
        root=fixed[0] if op == "broadcast" else 0,
        size=context.size,
        item_size=recording.dtype.itemsize,
        queue=context.executor.pending,
        otherwise=otherwise,
        watchdog=context.executor.started_watchdog(),
        limit=context.limit,
        error_type=mpi.Exception,
        shared=None if check is None else _shared(context, op, fixed, key),
        recording=recording,
        payload=payload,
    )


def native_enabled() -> bool:
    """Whether new plans get the C fast path: built, and not turned off by ``$COMMLAYER_C_FAST_PATHS=0``."""
    return _extension is not None and c_fast_paths_enabled()


def _handles(
    context: MpiFastPathContext, op: str, fixed: tuple[Any, ...], recording: Recording, size: int
) -> tuple[int, int, int, int]:
    """(communicator, datatype, reduction or 0) as unsigned integers of ``size`` bytes, and
    MPI_IN_PLACE's address."""
    reduction = (
        context.reductions[fixed[0]][recording.dtype]
        if op in ("all_reduce", "reduce_scatter_tensor")
        else None
    )
    mask = (1 << (8 * size)) - 1  # MPICH's handles are C ints, which mpi4py may give as negatives
    handles = (
        context.comm.handle,
        context.datatypes[recording.dtype].handle,
        getattr(reduction, "handle", 0),
    )
    in_place = int(context.mpi.IN_PLACE) & ((1 << (8 * ctypes.sizeof(ctypes.c_void_p))) - 1)  # an address
    return (*(value & mask for value in handles), in_place)


def _shared(context: MpiFastPathContext, op: str, fixed: tuple[Any, ...], key: int) -> tuple[Any, ...]:
    """The check's slots as the C fast path reads them, whether it may speculate (see
    _shared_signatures), and Python's checks of a published call for whatever the fast path leaves
    to them (a late peer, a mismatch; before and after a speculative call)."""
    check = context.check
    shared = check.shared
    mine, peers = shared.addresses()
    verify, speculated = check.gathered(op, key, _nothing), check.speculated(op, key)
    # Spin before yielding only while every rank can have a CPU of its own (as csrc/shm does).
    spin_polls = _SPIN_POLLS if context.size <= len(os.sched_getaffinity(0)) else _SHARED_CPU_SPIN_POLLS
    speculates = op in _INPUT_UNWRITTEN or (op == "broadcast" and fixed[0] == context.rank)
    return (shared.sequence_counter(), mine, peers, key, verify, spin_polls, speculates, speculated)


def _nothing() -> None:
    pass


def _handle_size(mpi: Any) -> int | None:
    """The size of MPI's handles (int: MPICH's ABI, pointer: Open MPI's), if the fast path knows it."""
    sizes = {mpi._sizeof(kind) for kind in (mpi.Comm, mpi.Datatype, mpi.Op)}
    (size,) = sizes if len(sizes) == 1 else (None,)
    return size if size in (ctypes.sizeof(ctypes.c_int), ctypes.sizeof(ctypes.c_void_p)) else None


@functools.cache
def _library_functions() -> dict[str, int] | None:
    """The addresses of the fast paths' MPI functions in the one MPI library mapped into this
    process, or None."""
    try:  # Linux's list of what this process has mapped; elsewhere, no C fast path
        with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
            paths = {line.split()[-1] for line in maps if _MPI_LIBRARY.search(line.rstrip())}
    except OSError:
        return None
    if len(paths) != 1:
        return None
    try:  # RTLD_NOLOAD: the library mpi4py loaded, never another one
        library = ctypes.CDLL(paths.pop(), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        return {
            name: ctypes.cast(getattr(library, name), ctypes.c_void_p).value for name, _ in _CALLS.values()
        }
    except (OSError, AttributeError):
        return None
