"""The mismatch check every backend plugs into: each rank's collective signature compared across
the group before the collective runs, so a mismatched call raises the same
:class:`~commlayer.core.errors.CollectiveMismatchError` on every rank instead of hanging,
aborting a rank or returning wrong data.

- :mod:`.signature`: what is compared (op, dtype, reduce op, root, element count, packed into two
  int64 words) and the one message every backend raises.
- :mod:`.shared_slots`: the exchange through shared memory (ranks on one host);
  :mod:`.host_segment` maps it from /dev/shm.
- :mod:`.checks`: the checks a backend holds: :func:`~.checks.group_check` picks shared memory on
  one host and one MAX reduction through the backend's library across hosts.

gloo and ccl hold a :func:`~.checks.group_check`; mpi builds its own exchange (an MPI shared
window, or one ``Allreduce``) from :mod:`.shared_slots` and :mod:`.signature`; shm compares the
signature beside each op's step counter in C++ (csrc/shm/comm.cpp) and writes the same message;
debug mode's store check (:mod:`commlayer.facade.calls.debug_check`) too.
"""

from commlayer.contract.mismatch.checks import (
    Members,
    MismatchCheck,
    ReductionCheck,
    SharedMemoryCheck,
    group_check,
    split_counts,
)
from commlayer.contract.mismatch.signature import checked_before, describe, mismatch_error

__all__ = [
    "Members",
    "MismatchCheck",
    "ReductionCheck",
    "SharedMemoryCheck",
    "checked_before",
    "describe",
    "group_check",
    "mismatch_error",
    "split_counts",
]
