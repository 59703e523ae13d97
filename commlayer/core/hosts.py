"""Which ranks of a group share a host, exchanged through the rendezvous store.

Host identity is exchanged, never guessed from addresses: two ranks share a host when they have
the same host name and see the same kernel (boot id) and the same /dev/shm (device and inode):
then a segment one of them creates can be mapped by the other. (The host name keeps network+UTS
namespace "hosts" apart, as real hosts would be.) ``COMMLAYER_HOST_ID`` overrides it, so
tests can split one machine into several "hosts".
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from commlayer.core import settings
from commlayer.core.types import GroupSpec

__all__ = ["HOST_ID_ENV", "HostMap", "exchange_hosts", "host_identity"]

HOST_ID_ENV = settings.HOST_ID.name
_SHARED_MEMORY = Path("/dev/shm")


def host_identity(environ: Mapping[str, str]) -> str:
    """What makes two processes one host: host name, kernel and /dev/shm."""
    override = settings.HOST_ID.text(environ) or ""
    if override:
        return f"override:{override}"
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = socket.gethostname()
    try:
        info = _SHARED_MEMORY.stat()
        shm = f"{info.st_dev}:{info.st_ino}"
    except OSError:
        shm = "none"
    return f"{socket.gethostname()}/{boot}/{shm}"


@dataclass(frozen=True)
class HostMap:
    """Group ranks partitioned by host, hosts in order of their lowest rank."""

    hosts: tuple[tuple[int, ...], ...]
    pids: tuple[int, ...]  # per group rank

    @property
    def single_host(self) -> bool:
        return len(self.hosts) == 1

    def host_of(self, group_rank: int) -> int:
        return next(index for index, ranks in enumerate(self.hosts) if group_rank in ranks)

    @property
    def leaders(self) -> tuple[int, ...]:
        return tuple(ranks[0] for ranks in self.hosts)


def exchange_hosts(spec: GroupSpec, prefix: str, environ: Mapping[str, str]) -> HostMap:
    """Every member publishes its host identity and pid; all read everyone's (collective)."""
    store = spec.store
    store.set(f"{prefix}/host/{spec.group_rank}", f"{os.getpid()} {host_identity(environ)}")
    identities, pids = [], []
    for rank in range(spec.size):
        pid, _, host = store.get(f"{prefix}/host/{rank}").decode().partition(" ")
        pids.append(int(pid))
        identities.append(host)
    order = list(dict.fromkeys(identities))
    hosts = tuple(tuple(r for r in range(spec.size) if identities[r] == host) for host in order)
    return HostMap(hosts, tuple(pids))
