"""Turn init_process_group's arguments and the launcher's environment into a store, rank and size.

``env://`` (the default) reads the environment through :func:`commlayer.rendezvous.discover`,
which knows torchrun, Open MPI, MPICH / Intel MPI / PMI(x) and SLURM. Under an MPI launcher with no
MASTER_ADDR, rank 0's address and a free port are exchanged over MPI itself. ``tcp://`` and
``file://`` go through torch's own rendezvous handlers. First, every backend is told which network
interface to use (:mod:`commlayer.netif`: ``COMMLAYER_SOCKET_IFNAME``, else the route to MASTER_ADDR).

Reaching the store is bounded by the init timeout. torch's TCPStore client waits forever on a
server that accepts and never answers (another program holding MASTER_PORT, a hung store), so it
connects on a helper thread and the caller gives up at the timeout with CommTimeoutError; a
MASTER_PORT that rank 0 cannot listen on raises RendezvousError naming the port.
"""

from __future__ import annotations

import atexit
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as torch_dist

from ..errors import CommTimeoutError, RendezvousError, invalid_argument
from ..metrics import format_duration
from ..netif import apply_interface_environment
from ..registry import get_backend_class
from ..rendezvous import RendezvousInfo, discover

__all__ = ["Rendezvous", "rendezvous"]

_MPI_SOURCES = ("openmpi", "mpich", "intel-mpi", "pmi", "pmix")


@dataclass(frozen=True)
class Rendezvous:
    store: Any  # torch.distributed.Store
    rank: int
    world_size: int


def rendezvous(
    init_method: str | None, store: Any, rank: int, world_size: int, timeout: timedelta
) -> Rendezvous:
    # Before any backend (or MPI_Init) reads its interface variables; see commlayer.netif.
    apply_interface_environment()
    if store is not None:
        _require_explicit(rank, world_size, "store")
        return Rendezvous(store, rank, world_size)
    if init_method and not init_method.startswith("env://"):
        found_store, found_rank, found_size = _bounded(
            lambda: next(
                torch_dist.rendezvous(init_method, rank=rank, world_size=world_size, timeout=timeout)
            ),
            f"the store of {init_method}",
            rank,
            timeout,
        )
        return Rendezvous(found_store, found_rank, found_size)
    return _from_environment(rank, world_size, timeout)


def _from_environment(rank: int, world_size: int, timeout: timedelta) -> Rendezvous:
    info = discover(os.environ)
    if info is None:
        if rank in (-1, 0) and world_size in (-1, 1):
            # A plain `python script.py`: a world of one needs no launcher.
            return Rendezvous(torch_dist.HashStore(), 0, 1)
        raise invalid_argument(
            "init_process_group",
            "init_method",
            "a launcher environment (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from torchrun or "
            "`commlayer run`, or mpirun/srun variables)",
            "none of them set",
            rank,
        )
    if (info.master_addr is None or info.master_port is None) and info.source in _MPI_SOURCES:
        info = _master_over_mpi(info)
        apply_interface_environment(info.master_addr)
    rank = info.rank if rank < 0 else rank
    world_size = info.world_size if world_size < 0 else world_size
    return Rendezvous(_tcp_store(info, rank, world_size, timeout), rank, world_size)


def _tcp_store(info: RendezvousInfo, rank: int, world_size: int, timeout: timedelta) -> Any:
    if info.master_addr is None or info.master_port is None:
        raise invalid_argument(
            "init_process_group",
            "MASTER_ADDR/MASTER_PORT",
            "both set",
            (info.master_addr, info.master_port),
            rank,
        )
    # torchrun's agent already hosts the store at MASTER_PORT; its workers only connect.
    agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    hosts = rank == 0 and not agent_hosts_store
    address = f"MASTER_ADDR:MASTER_PORT {info.master_addr}:{info.master_port}"
    return _bounded(
        lambda: torch_dist.TCPStore(
            info.master_addr, info.master_port, world_size, is_master=hosts, timeout=timeout
        ),
        f"the store at {address}",
        rank,
        timeout,
    )


_EXIT_WAIT_MARGIN_S = 1.0
_TIMED_OUT = re.compile(r"timed out|timeout", re.IGNORECASE)
_ADDRESS_IN_USE = re.compile(r"EADDRINUSE|address already in use", re.IGNORECASE)


def _bounded(connect: Callable[[], Any], store: str, rank: int, timeout: timedelta) -> Any:
    """``connect()`` run on a helper thread, abandoned at ``timeout``: a store that accepts the
    connection and never answers would otherwise block this rank forever."""
    outcome: list[Any] = []
    done = threading.Event()

    def attempt() -> None:
        try:
            outcome.append(connect())
        except BaseException as error:  # noqa: BLE001 - re-raised on the caller's thread
            outcome.append(error)
        done.set()

    connector = threading.Thread(target=attempt, name="commlayer-store-connect", daemon=True)
    connector.start()
    expired = CommTimeoutError(
        f"init_process_group: {store} did not answer within the timeout of {format_duration(timeout.total_seconds())} (rank {rank}); "
        "another program may hold MASTER_PORT, or the store's host (rank 0) failed or hangs, or "
        "another rank did not join"
    )
    if not done.wait(timeout.total_seconds()):
        # torch's connect retries past its own timeout (one more try after a random delay of up to
        # about the timeout again), and a thread still inside torch's C++ when the interpreter
        # finalizes aborts the process ("terminate called without an active exception"): exit
        # waits, boundedly, for the abandoned attempt to give up by itself.
        atexit.register(connector.join, 2 * timeout.total_seconds() + _EXIT_WAIT_MARGIN_S)
        raise expired
    if not isinstance(outcome[0], BaseException):
        return outcome[0]
    if isinstance(outcome[0], RuntimeError) and _TIMED_OUT.search(str(outcome[0])):
        # The store's own timeout (the host waiting for its clients) may fire just before ours.
        raise expired from outcome[0]
    if _ADDRESS_IN_USE.search(str(outcome[0])):
        raise RendezvousError(
            f"init_process_group: cannot host {store} (rank {rank}): the port is already in use by "
            "another program; choose a free MASTER_PORT"
        ) from outcome[0]
    raise outcome[0]


def _master_over_mpi(info: RendezvousInfo) -> RendezvousInfo:
    # The mpi backend's hook agrees on rank 0's address over MPI; the facade never imports it.
    return get_backend_class("mpi").complete_rendezvous(info)


def _require_explicit(rank: int, world_size: int, because: str) -> None:
    if world_size <= 0:
        raise invalid_argument(
            "init_process_group", "world_size", f"> 0 when {because} is given", world_size, rank
        )
    if not 0 <= rank < world_size:
        raise invalid_argument(
            "init_process_group", "rank", f"in [0, {world_size}) when {because} is given", rank, rank
        )
