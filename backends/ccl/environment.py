"""The environment oneCCL needs when it is launched by torchrun or commlayer instead of mpirun.

oneCCL reads its settings from environment variables once, on its first call, so they are set
before the first communicator is built. A variable the user already set is never touched.
What is chosen, and why (oneccl-cpu 2021.14 wheels, checked on this project's CI machine):

- ``CCL_ATL_TRANSPORT=ofi``: the default, ``mpi``, needs an MPI launcher; ``ofi`` (libfabric)
  works with the KVS address that commlayer exchanges through the rendezvous store.
- ``FI_PROVIDER=tcp`` and ``FI_PROVIDER_PATH``: the wheels ship libfabric providers in a private
  folder libfabric cannot find by itself; ``tcp`` is present on every Linux host.
- ``CCL_OFI_LIBRARY_PATH``: oneCCL dlopen()s libfabric at run time; naming the file means no
  ``LD_LIBRARY_PATH`` edits are needed (those only take effect at process start anyway).
- ``CCL_KVS_CONNECTION_TIMEOUT`` / ``CCL_KVS_GET_TIMEOUT``: 80% of the group timeout, so a bad
  KVS address fails in oneCCL, with a clear error, before commlayer's own deadline.
- ``CCL_LOCAL_RANK`` / ``CCL_LOCAL_SIZE``: the launcher's local layout (torchrun, mpirun, srun).
- ``CCL_WORKER_OFFLOAD=0`` only on an oversubscribed host (fewer usable cores than two per local
  rank): oneCCL's default worker thread per rank busy-polls, and on such a host it competes with
  the ranks themselves. Measured on the 2-core CI machine, 2 ranks: an 8-byte allreduce took
  ~4-15 ms with the worker and ~10 us without; 8 MiB ~15 ms against ~3 ms. Without the worker an
  op progresses while its Work is waited for or tested, instead of in the background.
- ``CCL_LOG_LEVEL=error``: every rank otherwise prints a warning for each variable set here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from datetime import timedelta

from commlayer.backends.ccl.locate import OneCclInstall

__all__ = ["HostLayout", "apply_defaults", "oneccl_defaults", "usable_cpus"]

_LIBFABRIC_NAMES = ("libfabric.so.1", "libfabric.so")


@dataclass(frozen=True)
class HostLayout:
    """This process's place on its host: ``local_rank`` of ``local_size`` ranks, ``cpus`` usable cores."""

    local_rank: int | None
    local_size: int
    cpus: int

    @property
    def oversubscribed(self) -> bool:
        # Each rank wants a core for itself and one for oneCCL's worker thread.
        return 2 * self.local_size > self.cpus


def oneccl_defaults(
    environ: Mapping[str, str], install: OneCclInstall | None, timeout: timedelta, host: HostLayout
) -> dict[str, str]:
    """The variables to add to ``environ``: oneCCL's needs minus what the user already set."""
    wanted = {
        "CCL_ATL_TRANSPORT": "ofi",
        "FI_PROVIDER": "tcp",
        "CCL_LOG_LEVEL": "error",
    }
    wanted.update(_timeouts(timeout))
    if host.local_rank is not None:
        wanted.update({"CCL_LOCAL_RANK": str(host.local_rank), "CCL_LOCAL_SIZE": str(host.local_size)})
    if host.oversubscribed:
        wanted["CCL_WORKER_OFFLOAD"] = "0"
    if install is not None:
        wanted.update(_libfabric_paths(install))
    return {name: value for name, value in wanted.items() if not environ.get(name)}


def apply_defaults(
    install: OneCclInstall | None,
    timeout: timedelta,
    host: HostLayout,
    environ: MutableMapping[str, str] | None = None,
) -> dict[str, str]:
    """Add :func:`oneccl_defaults` to the process environment; returns what was added."""
    environ = os.environ if environ is None else environ
    added = oneccl_defaults(environ, install, timeout, host)
    environ.update(added)
    return added


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _timeouts(timeout: timedelta) -> dict[str, str]:
    # oneCCL's own limit comes first (at 80%), so an unreachable KVS ends in oneCCL's error, with
    # its thread finished, rather than in commlayer's deadline with that thread still inside oneCCL.
    seconds = str(max(1, math.floor(0.8 * timeout.total_seconds())))
    return {"CCL_KVS_CONNECTION_TIMEOUT": seconds, "CCL_KVS_GET_TIMEOUT": seconds}


def _libfabric_paths(install: OneCclInstall) -> dict[str, str]:
    found: dict[str, str] = {}
    if install.libfabric_provider_dir.is_dir():
        found["FI_PROVIDER_PATH"] = str(install.libfabric_provider_dir)
    for name in _LIBFABRIC_NAMES:
        library = install.libfabric_dir / name
        if library.exists():
            found["CCL_OFI_LIBRARY_PATH"] = str(library)
            break
    return found
