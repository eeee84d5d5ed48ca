"""Which address a node advertises and which interface its collectives use."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO
from worker import network

INTERFACES = {
    "lo": ["127.0.0.1", "::1"],
    "eth0": ["10.0.0.11", "fe80::1"],
    "eth1": ["192.168.5.2"],
}


def test_the_interface_is_the_one_holding_the_address() -> None:
    assert network.interface_holding("10.0.0.11", INTERFACES) == "eth0"
    assert network.interface_holding("192.168.5.2", INTERFACES) == "eth1"
    assert network.interface_holding("127.0.0.1", INTERFACES) == "lo"
    assert network.interface_holding("10.0.0.12", INTERFACES) is None


def test_a_host_name_is_resolved_to_its_addresses() -> None:
    assert network.interface_holding("localhost", INTERFACES) == "lo"


def test_an_address_on_no_interface_is_refused_naming_it_and_the_interfaces() -> None:
    with pytest.raises(network.AddressNotLocal) as refused:
        network.node_address("http://10.0.0.1:8000", "203.0.113.9", None, INTERFACES)
    message = str(refused.value)
    assert "'203.0.113.9'" in message
    assert "eth0 (10.0.0.11 fe80::1)" in message and "lo (127.0.0.1 ::1)" in message


def test_a_named_interface_is_taken_as_it_is() -> None:
    # Behind NAT the advertised address may be on no interface here.
    chosen = network.node_address("http://10.0.0.1:8000", "203.0.113.9", "eth1", INTERFACES)
    assert chosen == network.NodeAddress("203.0.113.9", "eth1")


def test_without_an_address_the_route_to_the_server_decides() -> None:
    # A server on loopback: the route leaves from loopback.
    assert network.route_source("http://127.0.0.1:8000") == "127.0.0.1"
    chosen = network.node_address("http://127.0.0.1:8000", None, None, network.local_addresses())
    assert chosen == network.NodeAddress("127.0.0.1", "lo")


def test_every_transport_is_pinned_unless_the_environment_names_one() -> None:
    assert network.collective_env("eth0", {}) == {
        "GLOO_SOCKET_IFNAME": "eth0",
        "NCCL_SOCKET_IFNAME": "eth0",
        "TP_SOCKET_IFNAME": "eth0",
    }
    kept = network.collective_env("eth0", {"NCCL_SOCKET_IFNAME": "ib0"})
    assert "NCCL_SOCKET_IFNAME" not in kept and kept["GLOO_SOCKET_IFNAME"] == "eth0"


def test_this_hosts_interfaces_include_loopback() -> None:
    found = network.local_addresses()
    assert any("127.0.0.1" in ips for ips in found.values())
    assert all(ips for ips in found.values())


def test_a_worker_whose_address_is_not_its_own_exits_2_with_a_message() -> None:
    finished = subprocess.run(
        [
            sys.executable,
            "-m",
            "worker",
            "--address",
            "203.0.113.9",
            "--server",
            "http://127.0.0.1:9",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "DDPO_WORKER_PREWARM": "false"},
    )
    assert finished.returncode == 2, finished.stderr
    assert "'203.0.113.9' is on none of this host's interfaces" in finished.stderr
    assert "127.0.0.1" in finished.stderr  # the interfaces it has are named
