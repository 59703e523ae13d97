"""Rank bodies for the tests across namespace hosts (tests/launch/test_multihost.py)."""

from __future__ import annotations

import os
import socket

import torch

from commlayer import dist


def checks_then_compat(expected_interface: str, hosts: str) -> None:
    """One world for both: where the ranks run and which interface they use, then the compat suite
    on the world (the kit's subgroup pass adds nothing across hosts that one host does not test)."""
    from commlayer.testing import conformance

    interface_and_hosts(expected_interface, hosts)
    conformance.main("", "world-only")


def interface_and_hosts(expected_interface: str, hosts: str) -> None:
    """Each rank checks the interface commlayer told gloo to use and where every rank runs."""
    rank, world = dist.get_rank(), dist.get_world_size()
    assert os.environ.get("GLOO_SOCKET_IFNAME") == expected_interface, (
        rank,
        os.environ.get("GLOO_SOCKET_IFNAME"),
    )
    names: list[object] = [None] * world
    dist.all_gather_object(names, socket.gethostname())
    per_host = world // len(hosts.split(","))
    assert names == [hosts.split(",")[peer // per_host] for peer in range(world)], names
    values = torch.arange(3, dtype=torch.float64) + 10 * rank
    dist.all_reduce(values)
    expected = torch.arange(3, dtype=torch.float64) * world + 10 * sum(range(world))
    assert torch.equal(values, expected), (rank, values)


def shm_two_level() -> None:
    """shm across hosts with private /dev/shm each: it must pick its two-level form by itself."""
    from commlayer.testing import conformance

    dist.init_process_group("shm")
    backend = dist.group.WORLD.primary_backend
    assert type(backend).__name__ == "TwoLevelBackend", type(backend)
    conformance.main("", "world-only")
    dist.destroy_process_group()
