"""Worlds across two namespace "hosts" (commlayer.testing.cluster): 2 hosts x 2 ranks.

The hosts' names do not resolve unless the test asks for it, as on many cloud and container
clusters, and every host has a second interface that leads nowhere; each world must still find
its peers. Skip these with ``-m "not multihost"``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from commlayer.testing import require_mpirun, run_world
from commlayer.testing.cluster import (
    ClusterOptions,
    LinkShape,
    NetworkCluster,
    cluster_unavailable_reason,
    network_cluster,
)
from commlayer.testing.cluster_ssh import SshAccess, cluster_sshd, sshd_unavailable_reason
from commlayer.testing.cluster_worlds import MpirunHosts, SlurmHosts, TorchrunHosts

_REASON = cluster_unavailable_reason()
pytestmark = [
    pytest.mark.multihost,
    pytest.mark.skipif(_REASON is not None, reason=f"namespace cluster unavailable: {_REASON}"),
]


@pytest.fixture(scope="module")
def unnamed_cluster() -> Iterator[NetworkCluster]:
    """Two hosts whose names do not resolve, each with a dead-end second interface."""
    with network_cluster(ClusterOptions(hosts=2, side_interface=True)) as cluster:
        yield cluster
        assert cluster.leftover_processes() == {}


@pytest.fixture(scope="module")
def ssh_cluster() -> Iterator[tuple[NetworkCluster, SshAccess]]:
    """Unresolvable names and a dead-end interface again, with sshd on every host."""
    reason = sshd_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    # Intel MPI takes namespace hosts for one node (one kernel) and needs their /dev/shm shared.
    with (
        network_cluster(ClusterOptions(hosts=2, side_interface=True, private_shm=False)) as cluster,
        cluster_sshd(cluster) as access,
    ):
        yield cluster, access


@pytest.fixture(scope="module")
def named_cluster() -> Iterator[NetworkCluster]:
    with network_cluster(ClusterOptions(hosts=2, resolvable_names=True)) as cluster:
        yield cluster
        assert cluster.leftover_processes() == {}


def run_on(host_command: list[str]) -> str:
    return subprocess.run(host_command, capture_output=True, text=True, timeout=60, check=True).stdout


# ---- tier 2: the cluster itself -----------------------------------------------------------------


def test_hosts_have_own_names_addresses_and_a_dead_end_interface(unnamed_cluster: NetworkCluster) -> None:
    first, second = unnamed_cluster.hosts
    assert run_on(second.command(["hostname"])).strip() == second.name != first.name
    probe = (
        "import sys; from commlayer.core.netif import route_interface, interface_addresses;"
        "print(route_interface(sys.argv[1]), route_interface(sys.argv[2]), sorted(interface_addresses()))"
    )
    routes = run_on(first.command([sys.executable, "-c", probe, second.address, second.side_address or ""]))
    assert routes.strip() == "cl0 side0 ['cl0', 'lo', 'side0']"
    unresolved = subprocess.run(
        first.command(["getent", "hosts", second.name]), check=False, capture_output=True, timeout=30
    )
    assert unresolved.returncode != 0  # names do not resolve in this cluster


def test_teardown_removes_namespaces_and_processes() -> None:
    with network_cluster(ClusterOptions(hosts=2)) as cluster:
        sleeper = subprocess.Popen(cluster.hosts[1].command(["sleep", "600"]))
        namespaces = [host.namespace for host in cluster.hosts]
    assert sleeper.wait(timeout=10) != 0
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not any(namespace in listed for namespace in namespaces)
    assert cluster.tag not in Path("/proc/mounts").read_text(encoding="utf-8")


def test_link_shapes_become_tc_arguments() -> None:
    assert LinkShape(rate_mbit=1000).tc_arguments() == [
        "tbf",
        "rate",
        "1000mbit",
        "burst",
        "125000",
        "latency",
        "50ms",
    ]
    netem = LinkShape(delay_ms=1, loss_percent=0.5, rate_mbit=100).tc_arguments()
    assert netem == ["netem", "delay", "1ms", "loss", "0.5%", "rate", "100mbit"]
    assert LinkShape().tc_arguments() == [] and LinkShape().describe() == "unshaped"
    with pytest.raises(
        ValueError, match="LinkShape: argument 'rate_mbit' expected a positive rate, received 0"
    ):
        LinkShape(rate_mbit=0)


def test_shaped_links_carry_their_qdisc() -> None:
    with network_cluster(ClusterOptions(hosts=1, link=LinkShape(rate_mbit=100))) as cluster:
        host = cluster.hosts[0]
        shown = run_on(host.command(["tc", "qdisc", "show", "dev", host.interface]))
    assert "tbf" in shown and "rate 100Mbit" in shown, shown


# ---- tier 3: worlds across the hosts ------------------------------------------------------------
# One world per launcher and backend: the interface and placement checks, then the compatibility suite.


def host_names(cluster: NetworkCluster) -> str:
    return ",".join(host.name for host in cluster.hosts)


@pytest.mark.multirank
def test_torchrun_nodes_on_gloo_where_names_do_not_resolve(unnamed_cluster: NetworkCluster) -> None:
    """commlayer picks cl0, the interface that routes to MASTER_ADDR (plain gloo falls back to loopback)."""
    run_world(
        "tests.launch.multihost_ranks:checks_then_compat",
        4,
        launcher=TorchrunHosts(unnamed_cluster),
        args=["cl0", host_names(unnamed_cluster)],
        timeout=300,
    )


@pytest.mark.multirank
@pytest.mark.ccl
def test_torchrun_nodes_on_ccl(unnamed_cluster: NetworkCluster) -> None:
    from tests.backends.test_ccl import _REASON as ccl_problem

    if ccl_problem is not None:
        pytest.skip(f"ccl unavailable: {ccl_problem}")
    run_world(
        "commlayer.testing.conformance:main",
        4,
        args=["", "world-only"],
        backend="ccl",
        launcher=TorchrunHosts(unnamed_cluster),
        timeout=300,
    )


@pytest.mark.multirank
def test_torchrun_nodes_on_two_level_shm(unnamed_cluster: NetworkCluster) -> None:
    """Each host has its own /dev/shm, so shm must choose its two-level form (shm per host, gloo between)."""
    run_world(
        "tests.launch.multihost_ranks:shm_two_level",
        4,
        backend=None,
        launcher=TorchrunHosts(unnamed_cluster),
        timeout=300,
    )


@pytest.mark.multirank
def test_srun_variables_with_commlayer_socket_ifname(named_cluster: NetworkCluster) -> None:
    """SLURM_PROCID and friends only: MASTER_ADDR is the first name of SLURM_NODELIST, resolved.
    (The kit itself runs across these hosts under torchrun; this world checks the launch path.)"""
    run_world(
        "tests.launch.multihost_ranks:interface_and_hosts",
        4,
        launcher=SlurmHosts(named_cluster),
        env={"COMMLAYER_SOCKET_IFNAME": "cl0"},
        args=["cl0", host_names(named_cluster)],
        timeout=300,
    )


@pytest.mark.multirank
@pytest.mark.mpi
def test_mpirun_over_sshd_on_the_mpi_backend(ssh_cluster: tuple[NetworkCluster, SshAccess]) -> None:
    require_mpirun()
    run_world(
        "commlayer.testing.conformance:main",
        4,
        args=["", "world-only"],
        backend="mpi",
        launcher=MpirunHosts(*ssh_cluster),
        timeout=300,
    )


@pytest.mark.multirank
@pytest.mark.mpi
def test_mpirun_over_sshd_on_gloo_found_through_mpi(ssh_cluster: tuple[NetworkCluster, SshAccess]) -> None:
    """No MASTER_ADDR: rank 0's address is exchanged over MPI, by address since names do not resolve.
    (The kit itself runs across these hosts under torchrun; this world checks the launch path.)"""
    require_mpirun()
    cluster, _ = ssh_cluster
    run_world(
        "tests.launch.multihost_ranks:interface_and_hosts",
        4,
        launcher=MpirunHosts(*ssh_cluster),
        args=["cl0", host_names(cluster)],
        timeout=300,
    )
