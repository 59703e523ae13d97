"""MPI as the rendezvous of a job that mpirun started without MASTER_ADDR.

The facade calls :func:`exchange_master_address` when the launcher environment names an MPI
launcher but no master; any backend then runs the job (gloo on CPU, nccl on GPU), MPI only tells
the ranks where rank 0's TCPStore is. ``mpirun -n 4 python train.py`` on hosts ``a`` (ranks 0, 1)
and ``b`` (ranks 2, 3)::

    every rank     all-gathers its processor name        -> ["a", "a", "b", "b"]
                   and its IPv4 addresses (interface order)
                   local rank = earlier ranks on its host  -> 0, 1, 0, 1 (local world size 2)
    rank 0         address: 127.0.0.1 if every rank is on its host, else the address of
                   COMMLAYER_SOCKET_IFNAME, else the one its host routes to the other hosts with
                   (found by their name, or, where names do not resolve, by their addresses);
                   port: a free one; MASTER_ADDR / MASTER_PORT, when set, are kept
    rank 0 -> all  broadcasts (address, port), or the error it hit, so that no rank waits forever
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable, Sequence
from types import ModuleType

from commlayer.backends.mpi.runtime import MpiLoadError, library_version, load_mpi
from commlayer.core import settings
from commlayer.core.errors import BackendUnavailableError, CommError
from commlayer.core.netif import interface_addresses
from commlayer.core.ports import free_port
from commlayer.core.rendezvous import RendezvousInfo

__all__ = ["exchange_master_address", "local_layout", "master_address"]

_LOOPBACK = "127.0.0.1"
_UNROUTED_PORT = 9  # "discard": a UDP connect sends nothing, it only asks the routing table


def exchange_master_address(info: RendezvousInfo) -> RendezvousInfo:
    """``info`` with rank 0's address and a free port filled in, and local ranks by host name."""
    mpi = _load(info)
    _check_same_world(mpi, info)
    comm = mpi.COMM_WORLD.Dup()
    try:
        gathered = comm.allgather((mpi.Get_processor_name(), _own_addresses()))
        hosts = [host for host, _ in gathered]
        peer = next((addresses for host, addresses in gathered if host != hosts[0]), [])
        outcome = comm.bcast(_master_endpoint(info, hosts, peer) if comm.Get_rank() == 0 else None, root=0)
    finally:
        comm.Free()
    if isinstance(outcome, str):
        raise CommError(
            f"init_process_group: rank 0 could not pick the rendezvous address over MPI (rank {info.rank}): {outcome}"
        )
    local_rank, local_world_size = local_layout(hosts, info.rank)
    address, port = outcome
    return dataclasses.replace(
        info, master_addr=address, master_port=port, local_rank=local_rank, local_world_size=local_world_size
    )


def local_layout(hosts: Sequence[str], rank: int) -> tuple[int, int]:
    """(local rank, local world size) of ``rank`` given every rank's host name.

    >>> local_layout(["a", "b", "a", "b", "a"], 4)
    (2, 3)
    """
    mine = hosts[rank]
    return sum(1 for host in hosts[:rank] if host == mine), sum(1 for host in hosts if host == mine)


def master_address(
    hosts: Sequence[str],
    route_towards: Callable[[str], str | None] | None = None,
    peer_addresses: Sequence[str] = (),
) -> str:
    """The address rank 0 (``hosts[0]``) can be reached at by every rank.

    ``peer_addresses`` are those of the first rank on another host, for hosts whose names do not
    resolve; an address rank 0 holds itself (the same docker0 range on every host) is skipped.

    >>> master_address(["a", "a"])
    '127.0.0.1'
    >>> master_address(["a", "b"], route_towards=lambda peer: "10.0.0.5")
    '10.0.0.5'
    """
    others = [host for host in hosts if host != hosts[0]]
    if not others:
        return _LOOPBACK
    named = settings.SOCKET_IFNAME.text()
    if named and named in interface_addresses():
        return interface_addresses()[named]
    route = route_towards or _source_address_towards
    return (
        route(others[0])
        or _routed_to_addresses(peer_addresses, route)
        or _non_loopback_address(hosts[0])
        or socket.getfqdn()
    )


def _routed_to_addresses(addresses: Sequence[str], route: Callable[[str], str | None]) -> str | None:
    own = set(interface_addresses().values())
    return next((found for address in addresses if address not in own and (found := route(address))), None)


def _own_addresses() -> list[str]:
    return [address for address in interface_addresses().values() if not address.startswith("127.")]


def _master_endpoint(
    info: RendezvousInfo, hosts: Sequence[str], peer: Sequence[str]
) -> tuple[str, int] | str:
    """Rank 0's (address, port), or the text of what went wrong (sent to every rank)."""
    try:
        address = info.master_addr or master_address(hosts, peer_addresses=peer)
        return address, info.master_port or free_port()
    except OSError as error:
        return f"{type(error).__name__}: {error}"


def _source_address_towards(peer_host: str) -> str | None:
    """The local IPv4 address the routing table uses to reach ``peer_host``, if it resolves."""
    try:
        peer = socket.getaddrinfo(peer_host, _UNROUTED_PORT, socket.AF_INET, socket.SOCK_DGRAM)[0][4]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(peer)
            address = probe.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


def _non_loopback_address(host: str) -> str | None:
    try:
        found = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return None
    return next((entry[4][0] for entry in found if not entry[4][0].startswith("127.")), None)


def _load(info: RendezvousInfo) -> ModuleType:
    try:
        return load_mpi()
    except MpiLoadError as error:
        raise BackendUnavailableError(
            f"init_process_group: {info.source} started this job without MASTER_ADDR, and finding rank 0's "
            f"address over MPI failed (rank {info.rank}): {error}. Alternatively pass MASTER_ADDR and "
            "MASTER_PORT to every rank (Open MPI: mpirun -x MASTER_ADDR=host -x MASTER_PORT=29500 ...)"
        ) from error


def _check_same_world(mpi: ModuleType, info: RendezvousInfo) -> None:
    world = mpi.COMM_WORLD
    if (world.Get_rank(), world.Get_size()) == (info.rank, info.world_size):
        return
    raise BackendUnavailableError(
        f"init_process_group: the launcher ({info.source}) made this process rank {info.rank} of "
        f"{info.world_size}, but the MPI library mpi4py loaded ({library_version(mpi)}) sees rank "
        f"{world.Get_rank()} of {world.Get_size()}: launcher and library belong to different MPI "
        "implementations. Use the library's own mpirun, or set MPI4PY_LIBMPI to the launcher's libmpi "
        "(Open MPI: libmpi.so.40, MPICH and Intel MPI: libmpi.so.12)."
    )
