"""Where a fault-tolerant job's store and member slot come from: the launcher's environment.

``Manager(options)`` needs no store and no member id; it reads them here:

- ``commlayer run --ft``: ``$COMMLAYER_FT_STORE`` names the store the launcher hosts in its own
  process (it outlives every member), the member is ``RANK`` of ``WORLD_SIZE`` (or the MPI
  launcher's rank under the mpirun fallback), and ``$COMMLAYER_FT_CHANNEL`` is a pipe to the slot
  keeper that restarts this member in place (:mod:`commlayer.launch.slot_keeper`).
- ``torchrun``: the elastic agent's store (``TORCHELASTIC_USE_AGENT_STORE``). torch's agent
  restarts every worker when one fails, so each start is a new job resuming from its checkpoint.
- ``mpirun`` alone: rank 0 hosts the store at ``MASTER_ADDR:MASTER_PORT``; mpirun ends the job
  when any process dies (MPI without ULFM cannot survive a death).

Keys of a whole-job restart (``TORCHELASTIC_RESTART_COUNT``, set by torchrun and by ``commlayer
run --max-restarts``) live under their own prefix: nothing of the failed start mixes in.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from commlayer.core import settings
from commlayer.core.errors import RendezvousEnvError
from commlayer.core.rendezvous import discover

__all__ = ["JobEnvironment", "connect_store", "job_environment", "job_prefix", "tell_keeper"]

RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
# An MPI launcher's own variables: `import torch` copies them into RANK/WORLD_SIZE
# (commlayer.facade.torch_bridge.autoload), so they tell mpirun's members apart.
_MPI_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
_TORCHRUN_NOTE = (
    "commlayer.ft: under torchrun a member's death restarts every member (torch's elastic agent "
    "restarts whole worlds): the job resumes from its last checkpoint. `commlayer run --ft` keeps "
    "the survivors training and restarts only the dead member."
)
_MPIRUN_NOTE = (
    "commlayer.ft: started by mpirun, which ends the job when any member dies (MPI without ULFM "
    "cannot survive a death): restart it from its last checkpoint (`commlayer run --ft` restarts it "
    "automatically)."
)


def job_prefix(base: str, restart: int) -> str:
    """The store key prefix of one start of the job (``restart`` whole-job restarts before it)."""
    return base if restart == 0 else f"{base}/restart{restart}"


@dataclass(frozen=True)
class JobEnvironment:
    """What the launcher told this member: its store, its slot and how it got here."""

    store_host: str
    store_port: int
    hosts_store: bool  # this process creates the store (rank 0 under a bare mpirun)
    member: int
    world_size: int
    launcher: str  # "commlayer run --ft", "commlayer run --ft (mpirun)", "torchrun" or "mpirun"
    restart: int  # whole-job restarts before this start
    slot_restart: int = 0  # restarts of this member in its slot (commlayer run --ft)
    channel: int | None = None  # the slot keeper's pipe (commlayer run --ft)

    @property
    def restarts_members(self) -> bool:
        """Whether a dead member comes back alone (``commlayer run --ft``); elsewhere the launcher
        restarts the whole job, so the survivors of a death end this start at once."""
        return self.launcher == "commlayer run --ft"

    def prefix_of(self, base: str) -> str:
        """The key prefix of this start of the job in the store (``base``: the options' prefix)."""
        return job_prefix(base, self.restart)

    @property
    def note(self) -> str | None:
        """One line for the user about what a death does under this launcher, or None."""
        return {"torchrun": _TORCHRUN_NOTE, "mpirun": _MPIRUN_NOTE}.get(self.launcher)


def job_environment(environ: Mapping[str, str] | None = None) -> JobEnvironment:
    """Read the launcher's variables (see the module docstring).

    Raises:
        RendezvousEnvError: no launcher that can run a fault-tolerant job started this process.
    """
    environ = os.environ if environ is None else environ
    info = discover(environ)
    if info is None:
        raise RendezvousEnvError(
            settings.FT_STORE.name,
            "a launcher's environment: start the job with `commlayer run --ft` (or torchrun), or "
            "pass Manager(store=..., member=...)",
            None,
        )
    restart = int(environ.get(RESTART_COUNT_ENV) or 0)
    address = settings.FT_STORE.text(environ)
    if address is not None:
        host, port = _address(address)
        slot_restart = int(settings.FT_SLOT_RESTART.value(environ) or 0)
        channel = settings.FT_CHANNEL.value(environ)
        # Under its mpirun fallback `commlayer run --ft` says itself that deaths restart the job.
        ft = "commlayer run --ft (mpirun)" if _under_mpi(environ) else "commlayer run --ft"
        return JobEnvironment(
            host, port, False, info.rank, info.world_size, ft, restart, slot_restart, channel
        )
    if info.master_addr is None or info.master_port is None:
        raise RendezvousEnvError("MASTER_ADDR/MASTER_PORT", "the address of the job's store", None)
    if environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        return JobEnvironment(
            info.master_addr, info.master_port, False, info.rank, info.world_size, "torchrun", restart
        )
    if _under_mpi(environ):
        hosts = info.rank == 0
        return JobEnvironment(
            info.master_addr, info.master_port, hosts, info.rank, info.world_size, "mpirun", restart
        )
    raise RendezvousEnvError(
        settings.FT_STORE.name,
        "a store that outlives every member: start the job with `commlayer run --ft` (a plain "
        "`commlayer run` stops every member when one dies)",
        None,
    )


def connect_store(environment: JobEnvironment, timeout: timedelta) -> Any:
    """The job's store: a client of the launcher's (or torchrun agent's) store, or the host."""
    import torch.distributed as torch_dist

    return torch_dist.TCPStore(
        environment.store_host,
        environment.store_port,
        environment.world_size if environment.hosts_store else None,
        is_master=environment.hosts_store,
        timeout=timeout,
        wait_for_workers=False,
    )


def tell_keeper(environment: JobEnvironment | None, word: str) -> None:
    """One word to the slot keeper (``lost``: no live member holds some shard of the state, so
    restarting this member cannot help)."""
    if environment is None or environment.channel is None:
        return
    with contextlib.suppress(OSError):
        os.write(environment.channel, f"{word}\n".encode())


def _under_mpi(environ: Mapping[str, str]) -> bool:
    return any(name in environ for name in _MPI_VARIABLES)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise RendezvousEnvError(settings.FT_STORE.name, "HOST:PORT", text)
    return host.strip("[]"), int(port)
