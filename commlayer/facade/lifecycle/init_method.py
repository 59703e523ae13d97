"""Turn init_process_group's arguments and the launcher's environment into a store, rank and size.

``env://`` (the default) reads the environment through :func:`commlayer.core.rendezvous.discover`,
which knows torchrun, Open MPI, MPICH / Intel MPI / PMI(x) and SLURM. Under an MPI launcher with no
MASTER_ADDR, rank 0's address and a free port are exchanged over MPI itself. ``tcp://`` and
``file://`` go through torch's own rendezvous handlers. First, every backend is told which network
interface to use (:mod:`commlayer.core.netif`: ``COMMLAYER_SOCKET_IFNAME``, else the route to MASTER_ADDR).

Reaching the store is bounded by the init timeout. torch's TCPStore client waits forever on a
server that accepts and never answers (another program holding MASTER_PORT, a hung store), so it
connects on a helper thread and the caller gives up at the timeout with CommTimeoutError; a
MASTER_PORT that rank 0 cannot listen on raises RendezvousError naming the port. Every rank then
waits in the store until all have arrived; a rank whose launch variables are malformed (a RANK
beyond WORLD_SIZE) writes its error there before raising it, and every peer raises
RendezvousError naming it at once instead of waiting out the timeout.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as torch_dist

from commlayer.contract.registry import get_backend_class
from commlayer.core.errors import CommTimeoutError, RendezvousError, invalid_argument
from commlayer.core.metrics import format_duration
from commlayer.core.netif import apply_interface_environment
from commlayer.core.rendezvous import RendezvousEnvError, RendezvousInfo, discover

__all__ = ["Rendezvous", "rendezvous"]

log = logging.getLogger("commlayer.dist")

_MPI_SOURCES = ("openmpi", "mpich", "intel-mpi", "pmi", "pmix")


@dataclass(frozen=True)
class Rendezvous:
    store: Any  # torch.distributed.Store
    rank: int
    world_size: int


def rendezvous(
    init_method: str | None, store: Any, rank: int, world_size: int, timeout: timedelta
) -> Rendezvous:
    # Before any backend (or MPI_Init) reads its interface variables; see commlayer.core.netif.
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
    try:
        info = discover(os.environ)
    except RendezvousEnvError as error:
        _tell_the_job(error, timeout)
        raise
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
    store = _tcp_store(info, rank, world_size, timeout)
    _await_every_rank(store, rank, world_size, timeout, hosts_store=rank == 0 and not _agent_hosts_store())
    return Rendezvous(store, rank, world_size)


def _tcp_store(info: RendezvousInfo, rank: int, world_size: int, timeout: timedelta) -> Any:
    if info.master_addr is None or info.master_port is None:
        raise invalid_argument(
            "init_process_group",
            "MASTER_ADDR/MASTER_PORT",
            "both set",
            (info.master_addr, info.master_port),
            rank,
        )
    hosts = rank == 0 and not _agent_hosts_store()
    address = f"MASTER_ADDR:MASTER_PORT {info.master_addr}:{info.master_port}"
    return _bounded(
        lambda: _connect(info.master_addr, info.master_port, world_size, hosts, timeout),
        f"the store at {address}",
        rank,
        timeout,
    )


def _connect(host: str, port: int, world_size: int, hosts: bool, timeout: timedelta) -> Any:
    """The store, hosted or reached by short attempts until ``timeout``: an attempt abandoned at
    the deadline then ends within one attempt, where a single long one lingers past the exit."""
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        attempt = timedelta(seconds=max(0.1, min(_CONNECT_ATTEMPT_S, deadline - time.monotonic())))
        try:
            store = torch_dist.TCPStore(
                host, port, world_size, is_master=hosts, timeout=attempt, wait_for_workers=False
            )
        except RuntimeError as error:
            if hosts or not _RETRYABLE.search(str(error)) or time.monotonic() >= deadline:
                raise
            continue
        store.set_timeout(timeout)
        return store


def _agent_hosts_store() -> bool:
    """torchrun's agent already hosts the store at MASTER_PORT; its workers only connect."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"


def _generation() -> str:
    """Keys of one start of the job: torchrun's agent store outlives a restart."""
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")


def _await_every_rank(store: Any, rank: int, world_size: int, timeout: timedelta, hosts_store: bool) -> None:
    """Wait until every rank reached the store, or a rank reported a bad launch environment (then
    raise at once, naming it, rather than wait out the timeout for a rank that never comes)."""
    joined = f"{_JOINED}/{_generation()}"
    store.add(joined, 1)
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        if store.check([f"{_LAUNCH_ERROR}/{_generation()}"]):
            _name_the_launch_error(store, rank, world_size, hosts_store, deadline)
        count = store.add(joined, 0)
        if count >= world_size:
            return
        if time.monotonic() >= deadline:
            raise CommTimeoutError(
                f"init_process_group: {count} of {world_size} ranks reached the store within the timeout "
                f"of {timeout} (rank {rank}); a rank did not start, or started with another WORLD_SIZE"
            )
        time.sleep(0.01)


def _name_the_launch_error(
    store: Any, rank: int, world_size: int, hosts_store: bool, deadline: float
) -> None:
    """Raise the launch error a peer reported; the store's host first keeps the store up until
    every other good rank has read it (bounded), or the later ones could only time out."""
    key = f"{_LAUNCH_ERROR}/{_generation()}"
    why = store.get(key).decode(errors="replace")
    store.add(f"{key}/seen", 1)
    limit = min(deadline, time.monotonic() + _HOST_LINGER_S)
    while hosts_store and time.monotonic() < limit:
        if store.add(f"{key}/seen", 0) + store.add(f"{key}/count", 0) >= world_size:
            break
        time.sleep(0.01)
    raise RendezvousError(f"init_process_group: a rank of this job cannot start: {why} (rank {rank})")


def _tell_the_job(error: RendezvousEnvError, timeout: timedelta) -> None:
    """Write this rank's launch error into the job's store, so that every peer names it at once
    (best effort, bounded: the store's host may be the rank that cannot start)."""
    try:
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        limit = timedelta(seconds=min(timeout.total_seconds(), _TELL_LIMIT_S))
        store = _bounded(
            lambda: _connect(host, port, 1, False, limit), f"the store at {host}:{port}", -1, limit
        )
        key = f"{_LAUNCH_ERROR}/{_generation()}"
        store.set(key, f"{error} (host {socket.gethostname()}, pid {os.getpid()})")
        store.add(f"{key}/count", 1)
    except Exception as problem:  # noqa: BLE001 - the launch error itself is what the caller raises
        log.debug("commlayer: could not tell the job about %s: %s", error, problem)


# torch retries a refused connect once, after a randomized delay, so one short attempt can last
# several times its timeout, more under load. A store that accepted and never answers holds the
# attempt for good, so the wait must stay short.
_ABANDONED_ATTEMPT_LIMIT_S = 5.0
_CONNECT_ATTEMPT_S = 1.0
_TELL_LIMIT_S = 5.0
_HOST_LINGER_S = 10.0
_JOINED = "commlayer/joined"
_LAUNCH_ERROR = "commlayer/launch_error"
_TIMED_OUT = re.compile(r"timed out|timeout", re.IGNORECASE)
_RETRYABLE = re.compile(r"timed out|timeout|connection refused|ECONNREFUSED", re.IGNORECASE)
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
        # A thread still inside torch's C++ when the interpreter finalizes aborts the process
        # ("terminate called without an active exception"): exit waits, boundedly, for the
        # abandoned attempt, which ends within one of its short tries.
        atexit.register(_await_abandoned, connector, _ABANDONED_ATTEMPT_LIMIT_S)
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


def _await_abandoned(connector: threading.Thread, limit_s: float) -> None:
    if not connector.is_alive():
        return
    log.warning("commlayer: waiting up to %.0f s for an abandoned store connection to end", limit_s)
    connector.join(limit_s)
    if connector.is_alive():
        # Finalizing now would abort the process from inside torch's C++; end it plainly instead.
        log.error("commlayer: the abandoned store connection did not end; exiting without finalizing")
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(1)


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
