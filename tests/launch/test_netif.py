"""commlayer.core.netif: which interface every backend is told to use (tier 1, no communication)."""

from __future__ import annotations

from commlayer.core.netif import (
    INTERFACE_VARIABLES,
    interface_addresses,
    interface_environment,
    route_interface,
)


def test_explicit_interface_reaches_every_backend_variable() -> None:
    chosen = interface_environment({"COMMLAYER_SOCKET_IFNAME": "eth7"})
    assert chosen == dict.fromkeys(INTERFACE_VARIABLES, "eth7")
    assert {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "FI_TCP_IFACE", "OMPI_MCA_btl_tcp_if_include"} <= set(
        chosen
    )


def test_backend_variables_the_user_set_win() -> None:
    chosen = interface_environment({"COMMLAYER_SOCKET_IFNAME": "eth7", "NCCL_SOCKET_IFNAME": "ib0"})
    assert "NCCL_SOCKET_IFNAME" not in chosen and chosen["GLOO_SOCKET_IFNAME"] == "eth7"


def test_open_mpi_exclude_list_keeps_the_include_list_out() -> None:
    chosen = interface_environment(
        {"COMMLAYER_SOCKET_IFNAME": "eth7", "OMPI_MCA_btl_tcp_if_exclude": "docker0"}
    )
    assert "OMPI_MCA_btl_tcp_if_include" not in chosen and chosen["FI_TCP_IFACE"] == "eth7"


def test_route_to_master_addr_without_the_variable() -> None:
    assert route_interface("127.0.0.1") == "lo"
    assert interface_environment({"MASTER_ADDR": "127.0.0.1"})["GLOO_SOCKET_IFNAME"] == "lo"
    assert interface_environment({}, master_addr="localhost")["NCCL_SOCKET_IFNAME"] == "lo"


def test_unknown_master_names_no_interface() -> None:
    assert route_interface("no-such-host.invalid") is None
    assert interface_environment({"MASTER_ADDR": "no-such-host.invalid"}) == {}
    assert interface_environment({}) == {}


def test_interface_addresses_lists_loopback() -> None:
    assert interface_addresses()["lo"] == "127.0.0.1"
