"""Which network interface the backends' sockets use, chosen once for every backend.

Each transport picks its interface on its own, and the defaults break on multi-homed hosts: gloo
binds to whatever the machine's hostname resolves to (the loopback address, or nothing, when the
name does not resolve, as on many cloud and container clusters), Open MPI tries every interface
(docker0 bridges included), libfabric's tcp provider takes the first. commlayer names one:

1. ``COMMLAYER_SOCKET_IFNAME`` when set (one name, e.g. ``eth1``);
2. otherwise the interface the kernel routes ``MASTER_ADDR`` through (found with a connected UDP
   socket, which sends nothing), when MASTER_ADDR is known.

The chosen name goes to every backend's own variable; a backend variable the user set wins:

===============================  ====================================================
``GLOO_SOCKET_IFNAME``           gloo (torch)
``NCCL_SOCKET_IFNAME``           NCCL's bootstrap and socket transport
``TP_SOCKET_IFNAME``             torch RPC's TensorPipe
``FI_TCP_IFACE``                 libfabric tcp: oneCCL (FI_PROVIDER=tcp), Intel MPI's ofi
``CCL_KVS_IFACE``                oneCCL's key-value store, where ranks meet
``OMPI_MCA_btl_tcp_if_include``  Open MPI's TCP transport between ranks
``I_MPI_HYDRA_IFACE``            Intel MPI's launcher
===============================  ====================================================
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import ipaddress
import os
import socket
import struct
from collections.abc import Mapping

from commlayer.core import settings

__all__ = [
    "INTERFACE_VARIABLES",
    "SOCKET_IFNAME_ENV",
    "apply_interface_environment",
    "interface_addresses",
    "interface_environment",
    "route_interface",
    "route_source",
]

SOCKET_IFNAME_ENV = settings.SOCKET_IFNAME.name
INTERFACE_VARIABLES = (
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
    "FI_TCP_IFACE",
    "CCL_KVS_IFACE",
    "OMPI_MCA_btl_tcp_if_include",
    "I_MPI_HYDRA_IFACE",
)
_SIOCGIFADDR = 0x8915
_PROBE_PORT = 9  # discard; a UDP connect() only consults the routing table


def interface_environment(environ: Mapping[str, str], master_addr: str | None = None) -> dict[str, str]:
    """The interface variables to add to ``environ``; empty when no interface can be named.

    ``master_addr`` defaults to ``environ["MASTER_ADDR"]``. Variables already set are left out.

    >>> interface_environment({"COMMLAYER_SOCKET_IFNAME": "eth1", "NCCL_SOCKET_IFNAME": "ib0"})["GLOO_SOCKET_IFNAME"]
    'eth1'
    """
    name = settings.SOCKET_IFNAME.text(environ)
    if name is None:
        master = master_addr if master_addr is not None else environ.get("MASTER_ADDR")
        name = route_interface(master) if master else None
    if name is None:
        return {}
    # Open MPI refuses an include list next to the user's exclude list.
    taken = {"OMPI_MCA_btl_tcp_if_include"} if environ.get("OMPI_MCA_btl_tcp_if_exclude") else set()
    return {
        variable: name
        for variable in INTERFACE_VARIABLES
        if not environ.get(variable) and variable not in taken
    }


def apply_interface_environment(master_addr: str | None = None) -> dict[str, str]:
    """Add :func:`interface_environment` to this process's environment (before any backend reads it)."""
    added = interface_environment(os.environ, master_addr)
    os.environ.update(added)
    return added


def route_interface(address: str) -> str | None:
    """The name of the local interface the kernel would send to ``address`` from, or None.

    None when ``address`` does not resolve or is unreachable, or when no interface holds the
    source address (IPv6 and unusual setups: the backends then keep their own defaults).
    """
    source = route_source(address)
    if source is None:
        return None
    return next((name for name, held in interface_addresses().items() if held == source), None)


def route_source(address: str) -> str | None:
    """The local IPv4 address the kernel would send to ``address`` from (where that host reaches
    this one), or None when ``address`` does not resolve or is unreachable."""
    try:
        family, _, _, _, target = socket.getaddrinfo(address, _PROBE_PORT, socket.AF_INET, socket.SOCK_DGRAM)[
            0
        ]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(target)
            return str(probe.getsockname()[0])
    except OSError:
        return None


def interface_addresses() -> dict[str, str]:
    """Interface name -> its IPv4 address, for every interface that has one."""
    found: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as query:
        for _, name in socket.if_nameindex():
            request = array.array("B", struct.pack("256s", name.encode()[:15]))
            with contextlib.suppress(OSError):  # an interface without an IPv4 address
                fcntl.ioctl(query.fileno(), _SIOCGIFADDR, request, True)
                found[name] = str(ipaddress.IPv4Address(request.tobytes()[20:24]))
    return found
