"""Which address a node advertises, and which interface its collectives use.

A host's name often resolves to a loopback address (Debian and Ubuntu map it
to 127.0.1.1 or 127.0.0.1 in /etc/hosts). Left alone, gloo binds the address
the host name resolves to and tells its peers to connect there, so a rank on
another host connects to its own loopback and is refused. Every transport
torch uses is therefore pinned to the interface that holds the address the
node advertises.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

# The variables torch's transports read to pick their interface: gloo, NCCL's
# bootstrap and sockets, and TensorPipe (RPC).
INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


class AddressNotLocal(ValueError):
    """The advertised address is on none of this host's interfaces."""


def local_addresses() -> dict[str, list[str]]:
    """This host's interfaces and the IP addresses each holds (up ones first)."""
    import psutil

    up = {name for name, stats in psutil.net_if_stats().items() if stats.isup}
    found: dict[str, list[str]] = {}
    for name, addresses in psutil.net_if_addrs().items():
        ips = [
            a.address.split("%", 1)[0]
            for a in addresses
            if a.family in (socket.AF_INET, socket.AF_INET6)
        ]
        if ips:
            found[name] = ips
    return dict(sorted(found.items(), key=lambda item: item[0] not in up))


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def resolve(address: str) -> list[str]:
    """The IP addresses a host name (or literal address) stands for."""
    if _ip(address) is not None:
        return [address]
    try:
        infos = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def interface_holding(address: str, interfaces: Mapping[str, list[str]]) -> str | None:
    """The first interface one of whose addresses is ``address`` (an IP or a
    host name), or None."""
    wanted = {ip for text in resolve(address) if (ip := _ip(text)) is not None}
    for name, ips in interfaces.items():
        if any(_ip(ip) in wanted for ip in ips):
            return name
    return None


def describe(interfaces: Mapping[str, list[str]]) -> str:
    return ", ".join(f"{name} ({' '.join(ips)})" for name, ips in interfaces.items()) or "none"


def route_source(server_url: str) -> str:
    """The local address this host's route to the server leaves from: the
    address the server, and so most likely every peer, reaches it at.

    A UDP socket's ``connect`` only chooses the route; nothing is sent.
    OSError if there is no route (or the name does not resolve)."""
    parts = urlsplit(server_url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(sockaddr)
        return str(probe.getsockname()[0])


@dataclass(frozen=True)
class NodeAddress:
    """What a node tells its peers, and the interface its ranks use."""

    address: str
    interface: str | None


def node_address(
    server_url: str,
    address: str | None,
    interface: str | None,
    interfaces: Mapping[str, list[str]],
) -> NodeAddress:
    """The address to advertise (``address``, else the route to the server's
    source) and the interface for collectives (``interface``, else the one
    holding that address). AddressNotLocal if no interface holds the address
    and none was named."""
    advertised = address or route_source(server_url)
    if interface is not None:
        return NodeAddress(advertised, interface)
    holding = interface_holding(advertised, interfaces)
    if holding is None:
        raise AddressNotLocal(
            f"address {advertised!r} is on none of this host's interfaces: "
            f"{describe(interfaces)}. Give --address one of them (the address peers "
            "reach this node at), or name the interface with --interface"
        )
    return NodeAddress(advertised, holding)


def collective_env(interface: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """The interface variables a rank sets: the node's interface for each
    transport, except where the worker's environment already names one."""
    if interface is None:
        return {}
    return {name: interface for name in INTERFACE_VARIABLES if name not in environ}
