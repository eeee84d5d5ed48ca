"""Hosts of their own on one machine: a network namespace per host, each with
a veth pair onto one bridge, an address of its own and a link that can be
rate-limited (``tc`` tbf) and cut. The tests, the multi-host benchmark and
``ddpo local-cluster --hosts`` use them, so that every multi-machine path is
tried across real network hosts and not only over loopback.

Needs root and iproute2. The kernel here has tbf and htb but not netem, so a
link can be slowed and cut but not given added delay or random loss.

Each host's ``/etc/hosts`` (``ip netns exec`` mounts ``/etc/netns/NS/hosts``
over it) maps the machine's host name to 127.0.0.1, as Debian and Ubuntu
hosts do: the case in which collectives, left alone, advertise loopback.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

NETNS_ETC = Path("/etc/netns")
# Interfaces named <prefix><tag>...: at most 15 characters.
PREFIX = "ddpo"
INNER_INTERFACE = "eth0"


class HostsUnavailable(RuntimeError):
    """This machine cannot make test hosts (not root, no iproute2, no namespaces)."""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise HostsUnavailable(f"{' '.join(argv)}: {result.stderr.strip() or result.stdout}")
    return result


def unavailable_reason() -> str | None:
    """Why test hosts cannot be made here, or None if they can."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    probe = f"{PREFIX}-probe-{os.getpid()}"
    made = _run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"the kernel refuses network namespaces: {made.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


def _used_networks() -> list[ipaddress.IPv4Network]:
    routes = json.loads(_run("ip", "-j", "-4", "route", "show", "table", "all").stdout or "[]")
    used = []
    for route in routes:
        dst = route.get("dst", "")
        if dst and dst != "default":
            try:
                used.append(ipaddress.ip_network(dst, strict=False))
            except ValueError:
                continue
    return [n for n in used if isinstance(n, ipaddress.IPv4Network)]


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 no route of this machine covers, from 10.254.0.0/16."""
    used = _used_networks()
    start = os.getpid() % 250
    for offset in range(250):
        candidate = ipaddress.IPv4Network(f"10.254.{(start + offset) % 250 + 1}.0/24")
        if not any(candidate.overlaps(n) for n in used):
            return candidate
    raise HostsUnavailable("no free /24 in 10.254.0.0/16 for the test hosts")


@dataclass(frozen=True)
class Host:
    name: str
    namespace: str
    address: str
    bridge_side: str  # its veth's end on the bridge, in the machine's own namespace


@dataclass
class TestHosts:
    """Start with :meth:`create` (or as a context manager); :meth:`remove`
    kills what runs in the hosts and deletes them, always."""

    names: list[str]
    # Names this set's namespaces and interfaces apart from any other's.
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    hosts: dict[str, Host] = field(default_factory=dict)
    bridge: str = ""
    gateway: str = ""  # the bridge's address: how this machine reaches the hosts
    subnet: ipaddress.IPv4Network | None = None

    __test__ = False  # not a pytest class

    def __enter__(self) -> TestHosts:
        self.create()
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def create(self) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise HostsUnavailable(reason)
        self.subnet = _free_subnet()
        addresses = list(self.subnet.hosts())
        self.gateway = str(addresses[0])
        self.bridge = f"{PREFIX}{self.tag}br"
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
            for index, name in enumerate(self.names):
                self._add_host(index, name, str(addresses[10 + index]))
        except BaseException:
            self.remove()
            raise

    def _add_host(self, index: int, name: str, address: str) -> None:
        host = Host(
            name=name,
            namespace=f"{PREFIX}-{self.tag}-{name}",
            address=address,
            bridge_side=f"{PREFIX}{self.tag}h{index}",
        )
        self.hosts[name] = host
        ns, outer, inner = host.namespace, host.bridge_side, f"{PREFIX}{self.tag}i{index}"
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        _run("ip", "link", "set", inner, "netns", ns)
        _run("ip", "-n", ns, "link", "set", inner, "name", INNER_INTERFACE)
        _run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", INNER_INTERFACE)
        _run("ip", "-n", ns, "link", "set", INNER_INTERFACE, "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "link", "set", outer, "master", self.bridge)
        _run("ip", "link", "set", outer, "up")
        etc = NETNS_ETC / ns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(
            f"127.0.0.1\tlocalhost {socket.gethostname()}\n::1\tlocalhost ip6-localhost\n"
        )

    def remove(self) -> None:
        for host in self.hosts.values():
            for pid in self.pids(host.name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            # Either end of a veth takes the pair with it; this end goes even
            # while a dying process still holds the namespace.
            _run("ip", "link", "del", host.bridge_side, check=False)
            _run("ip", "netns", "del", host.namespace, check=False)
            shutil.rmtree(NETNS_ETC / host.namespace, ignore_errors=True)
        if self.bridge:
            _run("ip", "link", "del", self.bridge, check=False)
        self.hosts.clear()

    # --- what runs there -------------------------------------------------------

    def address(self, name: str) -> str:
        return self.hosts[name].address

    def command(self, name: str, argv: list[str]) -> list[str]:
        """``argv`` run on the host (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.hosts[name].namespace, *argv]

    def pids(self, name: str) -> list[int]:
        listing = _run("ip", "netns", "pids", self.hosts[name].namespace, check=False).stdout
        return [int(word) for word in listing.split()]

    # --- the link ---------------------------------------------------------------

    def limit_rate(self, name: str, mbit_per_s: float) -> None:
        """Both directions of the host's link at this rate (tbf)."""
        host = self.hosts[name]
        rate_bytes = mbit_per_s * 1e6 / 8
        # At least a GSO packet, and enough for a 4 ms timer tick at full rate.
        burst = max(128 * 1024, int(rate_bytes / 250 * 2))
        shape = ["root", "tbf", "rate", f"{mbit_per_s}mbit", "burst", str(burst)]
        shape += ["latency", "50ms"]
        _run("ip", "netns", "exec", host.namespace, "tc", "qdisc", "replace", "dev",
             INNER_INTERFACE, *shape)  # fmt: skip
        _run("tc", "qdisc", "replace", "dev", host.bridge_side, *shape)

    def clear_rate(self, name: str) -> None:
        host = self.hosts[name]
        _run("ip", "netns", "exec", host.namespace, "tc", "qdisc", "del", "dev",
             INNER_INTERFACE, "root", check=False)  # fmt: skip
        _run("tc", "qdisc", "del", "dev", host.bridge_side, "root", check=False)

    def link_down(self, name: str) -> None:
        """Cut the host off the bridge, as a pulled cable: nothing in or out."""
        _run("ip", "link", "set", self.hosts[name].bridge_side, "down")

    def link_up(self, name: str) -> None:
        _run("ip", "link", "set", self.hosts[name].bridge_side, "up")

    def bytes_moved(self, name: str) -> tuple[int, int]:
        """(received, sent) by the host over its link so far."""
        stats = Path("/sys/class/net") / self.hosts[name].bridge_side / "statistics"
        # The bridge side sends what the host receives, and the other way round.
        return int((stats / "tx_bytes").read_text()), int((stats / "rx_bytes").read_text())
