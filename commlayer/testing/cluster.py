"""A cluster of K "hosts" on one machine: Linux network and UTS namespaces joined by a bridge.

Each host is a network namespace with its own hostname, loopback and one interface ``cl0`` on a
private subnet; the hosts' ``cl0`` are veth pairs whose other ends sit on a bridge inside a
separate "switch" namespace, so nothing is added to the machine's own network namespace and no
traffic can leave the namespaces the test created. Options add what real clusters have:

* ``link``: per-link shaping with ``tc`` on every host's ``cl0`` (rate through ``tbf``; delay and
  loss through ``netem``, which needs the kernel's sch_netem).
* ``side_interface``: a second interface ``side0`` on every host, addresses in one subnet that looks
  routable but whose links end nowhere (like docker0 bridges with the same range on every node):
  a backend that picks it hangs or fails, so the tests can show which interface was chosen.
* ``resolvable_names``: the hosts' names resolve (an /etc/hosts listing them is mounted in every
  host); by default they do not, as on many cloud and container clusters.

Each host also has its own mount namespace with, by default, a private ``/dev/shm``, so shared
memory works within a host and never across hosts, as on separate machines (commlayer's shm backend
then picks its two-level form by itself). ``private_shm=False`` shares the machine's: Intel MPI
still takes the hosts for one node (same kernel) and hangs in MPI_Init without a common /dev/shm.

Everything is named ``cl<tag>...`` with a random tag, so parallel test runs never collide, and
:func:`network_cluster` tears every namespace, mount and process down on exit, failed test or not::

    with network_cluster(ClusterOptions(hosts=2)) as cluster:
        subprocess.run(cluster.hosts[1].command(["hostname"]))   # prints the host's own name
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ClusterHost",
    "ClusterOptions",
    "ClusterUnavailable",
    "LinkShape",
    "NetworkCluster",
    "cluster_unavailable_reason",
    "netem_unavailable_reason",
    "network_cluster",
]

# Addresses exist only inside the namespaces a cluster creates (they never see each other's).
_SUBNET = "10.77.0"
_SIDE_SUBNET = "10.78.0"
_INTERFACE = "cl0"
_SIDE_INTERFACE = "side0"
_RUN_DIR = Path("/run/commlayer-cluster")
_COMMAND_SECONDS = 30


class ClusterUnavailable(RuntimeError):
    """This machine cannot build the cluster (not root, no iproute2, namespaces not permitted)."""


@dataclass(frozen=True)
class LinkShape:
    """``tc`` settings applied to every host's cluster interface (egress), so a round trip pays twice."""

    delay_ms: float = 0.0
    loss_percent: float = 0.0
    rate_mbit: float | None = None

    def __post_init__(self) -> None:
        if self.delay_ms < 0 or not 0 <= self.loss_percent < 100:
            raise ValueError(
                "LinkShape: arguments 'delay_ms' >= 0 and 'loss_percent' in [0, 100) expected, "
                f"received {self.delay_ms}, {self.loss_percent}"
            )
        if self.rate_mbit is not None and not self.rate_mbit > 0:
            raise ValueError(
                f"LinkShape: argument 'rate_mbit' expected a positive rate, received {self.rate_mbit}"
            )

    def tc_arguments(self) -> list[str]:
        """``tc qdisc add dev IF root ...`` arguments: netem when delay or loss is asked for, else tbf."""
        if self.delay_ms or self.loss_percent:
            netem = ["netem", "delay", f"{self.delay_ms:g}ms", "loss", f"{self.loss_percent:g}%"]
            return netem + ([] if self.rate_mbit is None else ["rate", f"{self.rate_mbit:g}mbit"])
        if self.rate_mbit is not None:
            # A burst of ~1 ms of traffic (at least 32 KiB) keeps tbf from throttling below the rate.
            burst = max(int(self.rate_mbit * 125), 32 * 1024)
            return ["tbf", "rate", f"{self.rate_mbit:g}mbit", "burst", str(burst), "latency", "50ms"]
        return []

    def describe(self) -> str:
        parts = [
            f"delay {self.delay_ms:g} ms" if self.delay_ms else "",
            f"loss {self.loss_percent:g}%" if self.loss_percent else "",
        ]
        parts.append("" if self.rate_mbit is None else f"rate {self.rate_mbit:g} Mbit/s")
        return ", ".join(part for part in parts if part) or "unshaped"


@dataclass(frozen=True)
class ClusterOptions:
    hosts: int = 2
    link: LinkShape | None = None
    side_interface: bool = False
    resolvable_names: bool = False
    private_shm: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.hosts <= 200:
            raise ValueError(f"ClusterOptions: argument 'hosts' expected 1..200, received {self.hosts}")


@dataclass(frozen=True)
class ClusterHost:
    index: int
    name: str  # the host's hostname (its UTS namespace)
    namespace: str  # the network namespace, for `ip netns exec`
    address: str  # on the cluster interface
    interface: str  # the interface that reaches the other hosts
    side_address: str | None  # on the dead-end interface, when the cluster has one
    uts_file: (
        Path  # the host's UTS (hostname) and mount (/dev/shm, /etc/hosts) namespaces, kept by bind mounts
    )
    mount_file: Path

    def command(self, argv: Sequence[str], cwd: str | Path | None = None) -> list[str]:
        """``argv`` run inside this host, in ``cwd`` (default: the current directory)."""
        namespaces = [
            f"--net=/run/netns/{self.namespace}",
            f"--uts={self.uts_file}",
            f"--mount={self.mount_file}",
        ]
        return ["nsenter", *namespaces, f"--wdns={cwd or os.getcwd()}", "--", *argv]

    def pids(self) -> list[int]:
        """Every process running in this host's network namespace."""
        listed = _run(["ip", "netns", "pids", self.namespace], check=False).stdout
        return [int(pid) for pid in listed.split()]


@dataclass(frozen=True)
class NetworkCluster:
    tag: str  # the random part of every name this cluster created
    hosts: tuple[ClusterHost, ...]
    options: ClusterOptions
    workdir: Path  # private to this cluster (keys, configs); removed at teardown

    def leftover_processes(self) -> dict[str, list[int]]:
        """Host name -> pids still running there (the no-orphans check)."""
        return {host.name: pids for host in self.hosts if (pids := host.pids())}


def cluster_unavailable_reason() -> str | None:
    """Why :func:`network_cluster` cannot run here (for pytest skips), or None when it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2 / util-linux)"
    probe = f"clprobe{secrets.token_hex(3)}"
    made = _run(["ip", "netns", "add", probe], check=False)
    if made.returncode != 0:
        return f"creating a network namespace was refused: {made.stderr.strip()}"
    _run(["ip", "netns", "del", probe], check=False)
    return None


def netem_unavailable_reason() -> str | None:
    """Why delay/loss shaping cannot run here (kernels built without sch_netem), or None."""
    probe = f"clprobe{secrets.token_hex(3)}"
    _run(["ip", "netns", "add", probe])
    try:
        _run(["ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1"])
        tried = _run(
            ["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "p0", "root", "netem"], check=False
        )
        return (
            None if tried.returncode == 0 else f"tc netem: {tried.stderr.strip()} (kernel without sch_netem)"
        )
    finally:
        _run(["ip", "netns", "del", probe], check=False)


@contextlib.contextmanager
def network_cluster(options: ClusterOptions = ClusterOptions()) -> Iterator[NetworkCluster]:
    """Build the cluster, yield it, and remove every trace of it however the body ends."""
    reason = cluster_unavailable_reason()
    if reason is not None:
        raise ClusterUnavailable(reason)
    tag = secrets.token_hex(3)
    undo: list[Callable[[], None]] = []
    try:
        with _sigterm_unwinds():
            yield _build(tag, options, undo)
    finally:
        for step in reversed(undo):
            with contextlib.suppress(Exception):
                step()


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """SIGTERM (``timeout``, a CI job cancelled) raises SystemExit, so the teardown still runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, leave)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _build(tag: str, options: ClusterOptions, undo: list[Callable[[], None]]) -> NetworkCluster:
    workdir = _RUN_DIR / tag
    workdir.mkdir(parents=True, mode=0o700)
    undo.append(lambda: shutil.rmtree(workdir, ignore_errors=True))
    # Namespace files can only be bind-mounted onto a mount that does not propagate.
    _run(["mount", "--bind", str(workdir), str(workdir)])
    undo.append(lambda: _run(["umount", "--lazy", str(workdir)], check=False))
    _run(["mount", "--make-private", str(workdir)])
    table = "127.0.0.1 localhost\n" + "".join(
        f"{_SUBNET}.{i + 1} {_host_name(tag, i)}\n" for i in range(options.hosts)
    )
    (workdir / "hosts").write_text(table, encoding="ascii")
    switch = f"cl{tag}-sw"
    _add_namespace(switch, undo)
    _run(["ip", "-n", switch, "link", "add", "br0", "type", "bridge"])
    _run(["ip", "-n", switch, "link", "set", "br0", "up"])
    hosts = tuple(_add_host(tag, index, switch, workdir, options, undo) for index in range(options.hosts))
    return NetworkCluster(tag, hosts, options, workdir)


def _add_host(
    tag: str, index: int, switch: str, workdir: Path, options: ClusterOptions, undo: list[Callable[[], None]]
) -> ClusterHost:
    namespace, name = f"cl{tag}-h{index}", _host_name(tag, index)
    _add_namespace(namespace, undo)
    address = f"{_SUBNET}.{index + 1}"
    _veth(namespace, _INTERFACE, switch, f"p{index}", f"{address}/24")
    _run(["ip", "-n", switch, "link", "set", f"p{index}", "master", "br0"])
    side_address = None
    if options.side_interface:
        side_address = f"{_SIDE_SUBNET}.{index + 1}"
        _veth(namespace, _SIDE_INTERFACE, switch, f"s{index}", f"{side_address}/24")  # unbridged: a dead end
    if options.link is not None and options.link.tc_arguments():
        shaping = ["tc", "qdisc", "add", "dev", _INTERFACE, "root", *options.link.tc_arguments()]
        _run(["ip", "netns", "exec", namespace, *shaping])
    uts_file, mount_file = workdir / f"uts-h{index}", workdir / f"mnt-h{index}"
    hosts_file = workdir / "hosts" if options.resolvable_names else None
    _persistent_namespaces(uts_file, mount_file, name, hosts_file, options.private_shm, undo)
    return ClusterHost(index, name, namespace, address, _INTERFACE, side_address, uts_file, mount_file)


def _host_name(tag: str, index: int) -> str:
    return f"node{index}-{tag}"


def _persistent_namespaces(
    uts_file: Path,
    mount_file: Path,
    name: str,
    hosts_file: Path | None,
    private_shm: bool,
    undo: list[Callable[[], None]],
) -> None:
    """A UTS namespace named ``name`` and a mount namespace (own /dev/shm and /etc/hosts if asked)."""
    uts_file.touch()
    mount_file.touch()
    setup = f"hostname {name}"
    setup += " && mount -t tmpfs -o mode=1777 shm /dev/shm" if private_shm else ""
    setup += f" && mount --bind {hosts_file} /etc/hosts" if hosts_file is not None else ""
    undo.append(lambda: _run(["umount", str(mount_file)], check=False))
    undo.append(lambda: _run(["umount", str(uts_file)], check=False))
    _run(
        [
            "unshare",
            f"--uts={uts_file}",
            f"--mount={mount_file}",
            "--propagation",
            "private",
            "sh",
            "-c",
            setup,
        ]
    )


def _add_namespace(namespace: str, undo: list[Callable[[], None]]) -> None:
    _run(["ip", "netns", "add", namespace])
    undo.append(lambda: _delete_namespace(namespace))
    _run(["ip", "-n", namespace, "link", "set", "lo", "up"])


def _veth(namespace: str, inner: str, switch: str, outer: str, address: str) -> None:
    """A veth pair created inside the switch namespace with its peer placed straight into the host."""
    _run(
        ["ip", "-n", switch, "link", "add", outer, "type", "veth", "peer", "name", inner, "netns", namespace]
    )
    _run(["ip", "-n", switch, "link", "set", outer, "up"])
    _run(["ip", "-n", namespace, "addr", "add", address, "dev", inner])
    _run(["ip", "-n", namespace, "link", "set", inner, "up"])


def _delete_namespace(namespace: str) -> None:
    """Kill what still runs inside (SIGTERM, then SIGKILL), then delete the namespace."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        pids = _run(["ip", "netns", "pids", namespace], check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(pid), signum)
        deadline = time.monotonic() + 3
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = _run(["ip", "netns", "pids", namespace], check=False).stdout.split()
    _run(["ip", "netns", "del", namespace], check=False)


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=_COMMAND_SECONDS, check=False)
    if check and done.returncode != 0:
        raise ClusterUnavailable(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done
