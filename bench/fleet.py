"""Simulated nodes: many worker nodes in one asyncio process, speaking the
worker protocol (register with the join token, long-poll, heartbeat, report
a part started and finished) and training nothing. For measuring the
control plane with thousands of nodes (bench/control_plane.py).

Each node holds one long-poll open at a time and beats every heartbeat
interval unless a poll was answered within it, as a real worker's daemon and
heartbeat thread do; a part it is given is reported started and succeeded
at once. Several server URLs
(servers sharing one database) split the nodes between them: node i speaks
to server i % len(urls).

    python -m bench.fleet --server http://127.0.0.1:8000 --nodes 1000 --join-token ...

Each node holds its own two keep-alive connections (bench/wire.py), so the
client's cost per request does not grow with the fleet.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field

import httpx

from bench.wire import ConnectionLost, KeepAliveConnection


@dataclass
class Latencies:
    """Seconds each request took, by kind; a long-poll's counted beyond its wait."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, seconds: float) -> None:
        self.samples.setdefault(kind, []).append(seconds)

    def failed(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def clear(self) -> None:
        self.samples.clear()
        self.errors.clear()

    def percentile(self, kind: str, fraction: float) -> float | None:
        values = sorted(self.samples.get(kind, ()))
        if not values:
            return None
        return values[min(len(values) - 1, int(fraction * len(values)))]


@dataclass
class SimulatedNode:
    name: str
    url: str
    polling: KeepAliveConnection  # polls, and the reports of the parts they start
    beating: KeepAliveConnection
    node_id: int = 0
    credential: str = ""
    parts_done: int = 0
    polled_at: float = float("-inf")  # its last poll sent, or answered (perf_counter)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.credential}"}


class Fleet:
    def __init__(
        self, urls: list[str], nodes: int, join_token: str | None, prefix: str = "sim"
    ) -> None:
        self.urls = urls
        self.join_token = join_token
        self.latencies = Latencies()
        self.nodes = [
            SimulatedNode(
                f"{prefix}-{i}",
                url := urls[i % len(urls)],
                KeepAliveConnection(url),
                KeepAliveConnection(url),
            )
            for i in range(nodes)
        ]
        self.poll_wait_s = 2.0
        self.heartbeat_interval_s = 2.0
        self._tasks: list[asyncio.Task[None]] = []

    async def register(self, concurrency: int = 32) -> float:
        """Register every node (``concurrency`` at a time); the seconds it
        took. Each node polls and beats as soon as it has registered, as a
        worker does (with thousands of nodes, the first would otherwise be
        silent past their timeout before the last had joined), until
        :meth:`stop`."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[SimulatedNode] = asyncio.Queue()
        for node in self.nodes:
            queue.put_nowait(node)
        headers = {"Authorization": f"Bearer {self.join_token}"} if self.join_token else {}
        started = time.perf_counter()
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        registering = httpx.AsyncClient(timeout=120, limits=limits)

        async def one_by_one() -> None:
            while not queue.empty():
                node = queue.get_nowait()
                number = int(node.name.rsplit("-", 1)[1])
                body = {
                    "name": node.name,
                    "address": f"10.{number // 65536 % 256}.{number // 256 % 256}.{number % 256}",
                }
                while True:
                    answer = await registering.post(
                        f"{node.url}/nodes/register", json=body, headers=headers
                    )
                    if answer.status_code != 429:
                        break
                    await asyncio.sleep(float(answer.headers.get("retry-after", "1")))
                answer.raise_for_status()
                registered = answer.json()
                node.node_id, node.credential = registered["node_id"], registered["credential"]
                self.poll_wait_s = registered["poll_wait_s"]
                self.heartbeat_interval_s = registered["heartbeat_interval_s"]
                self._tasks.append(loop.create_task(self._poll_forever(node)))
                self._tasks.append(loop.create_task(self._beat_forever(node)))

        async with registering:
            await asyncio.gather(*(one_by_one() for _ in range(concurrency)))
        return time.perf_counter() - started

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        for node in self.nodes:
            await node.polling.close()
            await node.beating.close()

    async def _poll_forever(self, node: SimulatedNode) -> None:
        running: list[int] = []
        while True:
            body = {"active_part_ids": running, "waiting_for_port": [], "wait_s": self.poll_wait_s}
            started = node.polled_at = time.perf_counter()
            try:
                answer = await node.polling.post(f"/nodes/{node.node_id}/poll", body, node.headers)
            except ConnectionLost:
                answer = None
            if answer is None or answer.status != 200:
                self.latencies.failed("poll")
                await asyncio.sleep(1.0)
                continue
            node.polled_at = time.perf_counter()
            took = node.polled_at - started
            given = answer.json()
            if not given["start"] and not given["stop"]:
                # Held for its wait, or answered at once: what it took beyond the wait.
                self.latencies.add("poll", max(0.0, took - self.poll_wait_s))
            for assignment in given["start"]:
                await self._run_at_once(node, assignment["part_id"])

    async def _run_at_once(self, node: SimulatedNode, part_id: int) -> None:
        """Started and succeeded, without training anything."""
        for route, body in (
            ("started", {"node_id": node.node_id}),
            ("finish", {"node_id": node.node_id, "status": "succeeded", "exit_code": 0}),
        ):
            started = time.perf_counter()
            for _attempt in range(30):
                # Sent again when the connection failed, as a worker does:
                # the server takes a report it already has as done.
                try:
                    path = f"/parts/{part_id}/{route}"
                    answer = await node.polling.post(path, body, node.headers)
                except ConnectionLost:
                    continue
                if answer.status == 200:
                    self.latencies.add(route, time.perf_counter() - started)
                    break
                if answer.status == 429 or answer.status >= 500:
                    # Busy: sent again after a while, as a worker's courier does.
                    await asyncio.sleep(float(answer.headers.get("retry-after", "1")))
                    continue
                self.latencies.failed(route)
                break
            else:
                self.latencies.failed(route)
        node.parts_done += 1

    async def _beat_forever(self, node: SimulatedNode) -> None:
        while True:
            started = time.perf_counter()
            if started - node.polled_at < self.heartbeat_interval_s:
                # As a worker's heartbeat thread: a poll (answered, or held
                # by the server now) just said the same.
                await asyncio.sleep(self.heartbeat_interval_s)
                continue
            try:
                answer = await node.beating.post(
                    f"/nodes/{node.node_id}/heartbeat", {"active_part_ids": []}, node.headers
                )
            except ConnectionLost:
                answer = None
            if answer is not None and answer.status == 200:
                self.latencies.add("heartbeat", time.perf_counter() - started)
            else:
                self.latencies.failed("heartbeat")
            elapsed = time.perf_counter() - started
            await asyncio.sleep(max(0.0, self.heartbeat_interval_s - elapsed))


async def _run(urls: list[str], nodes: int, join_token: str | None, seconds: float) -> None:
    fleet = Fleet(urls, nodes, join_token)
    took = await fleet.register()
    print(f"registered {nodes} nodes in {took:.1f} s ({nodes / took:.0f}/s)")
    await asyncio.sleep(seconds)
    for kind in ("poll", "heartbeat"):
        p50, p99 = fleet.latencies.percentile(kind, 0.5), fleet.latencies.percentile(kind, 0.99)
        if p50 is not None and p99 is not None:
            print(f"{kind}: p50 {1000 * p50:.1f} ms, p99 {1000 * p99:.1f} ms")
    print(f"errors: {fleet.latencies.errors or 'none'}")
    await fleet.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True, help="URL, or several comma-separated")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--join-token", default=os.environ.get("DDPO_JOIN_TOKEN"))
    parser.add_argument("--seconds", type=float, default=30.0, help="how long they run")
    args = parser.parse_args()
    urls = [u.strip().rstrip("/") for u in args.server.split(",") if u.strip()]
    asyncio.run(_run(urls, args.nodes, args.join_token, args.seconds))


if __name__ == "__main__":
    main()
