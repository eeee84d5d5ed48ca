"""Does watching a job slow it down? The default one-epoch job alone, with
50 clients polling GET /jobs/{id} once a second, and with 50 dashboard job
pages open on it (each: the job once a second, its metrics and last 100 log
lines every third second, as api/dashboard/app.js does), alternating,
through one local server and worker.

    python -m bench.dashboard_load --data-dir ../shared/data --rounds 3

The dashboards are minimal keep-alive HTTP clients in a thread of this
process at the lowest scheduling priority (they stand for browsers on other
machines), so that on a machine whose cores all train, the figure shows the
server's cost rather than the load generator's; their own CPU time is
printed alongside.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time
from dataclasses import dataclass, field

import psutil

from api.schemas import JobSpec
from bench._runs import Run, alternate, bench_parser, local_cluster, run_orchestrated
from cli.cluster import SERVER_NICE

DASHBOARDS = 50
ALONE = "alone"
POLLING = "50 polling /jobs/{id}"
PAGES = "50 job pages"


@dataclass
class Load:
    requests: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)


async def _get(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str
) -> tuple[int, bytes]:
    writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return status, await reader.readexactly(length)


async def _dashboard(
    port: int, job_id: int, full_page: bool, stop: asyncio.Event, load: Load, delay: float
) -> None:
    await asyncio.sleep(delay)  # dashboards are opened at different moments
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    tick = 0
    try:
        while not stop.is_set():
            started = time.perf_counter()
            paths = [f"/jobs/{job_id}"]
            if full_page and tick % 3 == 0:
                paths += [f"/jobs/{job_id}/metrics?max_points=500", f"/jobs/{job_id}/logs?tail=100"]
            for path in paths:
                sent = time.perf_counter()
                status, _ = await _get(reader, writer, path)
                load.latencies.append(time.perf_counter() - sent)
                load.requests += 1
                load.errors += status != 200
            tick += 1
            await asyncio.sleep(max(0.0, 1.0 - (time.perf_counter() - started)))
    finally:
        writer.close()


class Dashboards:
    """50 dashboards on one job, in a thread of their own, until stopped."""

    def __init__(self, port: int, job_id: int, full_page: bool) -> None:
        self.full_page = full_page
        self.load = Load()
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._thread = threading.Thread(target=self._run, args=(port, job_id), daemon=True)
        self.cpu_s = 0.0

    def _run(self, port: int, job_id: int) -> None:
        # The dashboards stand for browsers on other machines: at the lowest
        # priority, their CPU comes from what the training leaves, so what is
        # measured is the server's cost, not the load generator's.
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        asyncio.set_event_loop(self._loop)
        started = time.thread_time()
        tasks = [
            _dashboard(port, job_id, self.full_page, self._stop, self.load, i / DASHBOARDS)
            for i in range(DASHBOARDS)
        ]
        self._loop.run_until_complete(asyncio.gather(*tasks))
        self.cpu_s = time.thread_time() - started

    def __enter__(self) -> Dashboards:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--server-nice",
        type=int,
        default=None,
        help="the server's nice value (default: local clusters' own, "
        f"{SERVER_NICE}; 0 to compare with the server at the training's priority)",
    )
    args = parser.parse_args(argv)
    spec = JobSpec()
    loads: dict[str, list[tuple[Load, float, float]]] = {POLLING: [], PAGES: []}
    alone_cpu: list[float] = []
    with local_cluster(args.data_dir) as (cluster, client):
        assert cluster.server is not None
        server = psutil.Process(cluster.server.process.pid)
        if args.server_nice is not None:
            server.nice(args.server_nice)

        def quiet() -> Run:
            before = server.cpu_times()
            run = run_orchestrated(spec, client, ALONE)
            after = server.cpu_times()
            alone_cpu.append((after.user + after.system) - (before.user + before.system))
            return run

        def watched(way: str) -> Run:
            opened: list[Dashboards] = []

            def watch(job_id: int) -> Dashboards:
                opened.append(Dashboards(cluster.port, job_id, full_page=way == PAGES))
                return opened[-1]

            before = server.cpu_times()
            run = run_orchestrated(spec, client, way, watch=watch)
            after = server.cpu_times()
            server_cpu = (after.user + after.system) - (before.user + before.system)
            loads[way].append((opened[0].load, opened[0].cpu_s, server_cpu))
            return run

        runs = alternate(
            args.rounds,
            {ALONE: quiet, POLLING: lambda: watched(POLLING), PAGES: lambda: watched(PAGES)},
        )

    def mean(way: str, training: bool) -> float:
        return statistics.mean(
            (r.train_s or 0.0) if training else r.wall_s for r in runs if r.way == way
        )

    print(f"\nserver CPU a run, alone: {statistics.mean(alone_cpu):.2f} s")
    for way in (POLLING, PAGES):
        for label, training in (("training loop", True), ("wall", False)):
            alone, watched_s = mean(ALONE, training), mean(way, training)
            print(
                f"{way:<22} {label:<14} alone {alone:6.2f} s  watched {watched_s:6.2f} s  "
                f"ratio {watched_s / alone:.3f}"
            )
        latencies = sorted(x for load, _, _ in loads[way] for x in load.latencies)
        requests = sum(load.requests for load, _, _ in loads[way])
        errors = sum(load.errors for load, _, _ in loads[way])
        print(
            f"{'':<22} requests {requests} ({errors} errors), latency p50 "
            f"{1000 * latencies[len(latencies) // 2]:.1f} ms, p99 "
            f"{1000 * latencies[int(len(latencies) * 0.99)]:.1f} ms; CPU a run: server "
            f"{statistics.mean(s for _, _, s in loads[way]):.2f} s, the 50 clients "
            f"{statistics.mean(c for _, c, _ in loads[way]):.2f} s"
        )


if __name__ == "__main__":
    main()
