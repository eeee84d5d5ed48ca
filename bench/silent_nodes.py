"""What 1,000 registered nodes that do not poll cost a server with nothing
else to do: the tick (lost nodes, deadlines, retries, placement) and the
server's CPU, with queued jobs that no node can take (so every tick plans).

    python -m bench.silent_nodes --nodes 1000 --window 30

Two servers, one after the other in one run: one whose nodes have been
marked lost (silent past the heartbeat timeout) and one whose nodes are
still live but silent (a heartbeat timeout of an hour). The tick's time
comes from the server's own histogram (``ddpo_tick_duration_seconds`` at
/metrics), its CPU from /proc, both over the same window.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from cli.cluster import LocalCluster

QUEUED_JOBS = 10


@dataclass
class Figures:
    case: str
    nodes: int
    registrations_per_s: float
    ticks: int
    tick_mean_ms: float
    ticks_over_20ms: int
    cpu_share: float


def measure(case: str, nodes: int, window_s: float, heartbeat_timeout_s: float) -> Figures:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(
            state_dir=Path(tmp) / "cluster",
            data_dir=Path(tmp),
            workers=0,
            server_env={
                "DDPO_MAX_NODES": str(nodes),
                "DDPO_REGISTRATIONS_PER_MINUTE": str(nodes),
                "DDPO_HEARTBEAT_TIMEOUT_S": str(heartbeat_timeout_s),
            },
        )
        with cluster:
            assert cluster.tokens is not None and cluster.server is not None
            join = {"Authorization": f"Bearer {cluster.tokens.join}"}
            started = time.perf_counter()
            with httpx.Client(base_url=cluster.url, timeout=30) as client:
                for i in range(nodes):
                    client.post(
                        "/nodes/register",
                        json={"name": f"silent-{i}", "address": f"10.1.{i // 250}.{i % 250 + 1}"},
                        headers=join,
                    ).raise_for_status()
                registered_s = time.perf_counter() - started
                # A trainer no node has: each stays queued, and every tick plans it.
                for _ in range(QUEUED_JOBS):
                    client.post(
                        "/jobs",
                        json={
                            "topology": {"num_machines": 2, "num_processes": 1},
                            "trainer": "absent",
                        },
                        headers=cluster.headers("user"),
                    ).raise_for_status()
                # Let the nodes fall silent past the timeout (when it is short).
                time.sleep((heartbeat_timeout_s if heartbeat_timeout_s < 60 else 0) + 2.0)
                server = psutil.Process(cluster.server.process.pid)
                count0, sum0, fast0 = _ticks(client, cluster)
                cpu0 = sum(server.cpu_times()[:2])
                wall0 = time.perf_counter()
                time.sleep(window_s)
                cpu1 = sum(server.cpu_times()[:2])
                wall1 = time.perf_counter()
                count1, sum1, fast1 = _ticks(client, cluster)
    ticks = int(count1 - count0)
    return Figures(
        case=case,
        nodes=nodes,
        registrations_per_s=nodes / registered_s,
        ticks=ticks,
        tick_mean_ms=1000 * (sum1 - sum0) / max(ticks, 1),
        ticks_over_20ms=ticks - int(fast1 - fast0),
        cpu_share=(cpu1 - cpu0) / (wall1 - wall0),
    )


def _ticks(client: httpx.Client, cluster: LocalCluster) -> tuple[float, float, float]:
    """The tick histogram's count, sum and count within 20 ms."""
    text = client.get("/metrics", headers=cluster.headers("read")).raise_for_status().text

    def value(pattern: str) -> float:
        found = re.search(pattern + r" ([0-9.e+]+)", text)
        return float(found.group(1)) if found else 0.0

    return (
        value(r"ddpo_tick_duration_seconds_count"),
        value(r"ddpo_tick_duration_seconds_sum"),
        value(r'ddpo_tick_duration_seconds_bucket\{le="0.02"\}'),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--window", type=float, default=30.0, help="seconds measured")
    args = parser.parse_args()
    rows = [
        measure("lost (silent past 6 s)", args.nodes, args.window, 6.0),
        measure("live but silent", args.nodes, args.window, 3600.0),
    ]
    print(
        "| case | nodes | registrations/s | ticks | tick mean | ticks > 20 ms | server CPU |\n"
        "|---|---|---|---|---|---|---|"
    )
    for r in rows:
        print(
            f"| {r.case} | {r.nodes} | {r.registrations_per_s:.0f} | {r.ticks} | "
            f"{r.tick_mean_ms:.1f} ms | {r.ticks_over_20ms} | {100 * r.cpu_share:.1f}% |"
        )


if __name__ == "__main__":
    main()
