"""Does watching a job slow it down? The default one-epoch job, watched by
50 clients polling GET /jobs/{id} once a second, or by 50 dashboard job
pages (each: the job once a second, its metrics and last 100 log lines
every third second, as api/dashboard/app.js does), through one local server
and worker.

    python -m bench.dashboard_load --data-dir ../shared/data --rounds 8
    python -m bench.dashboard_load --data-dir ../shared/data --rounds 8 --compare-open

Within each run the dashboards poll in alternate windows and are silent in
between (see ``Dashboards``); rank 0's progress reports give the training's
speed in each, so polled and quiet spans are compared seconds apart, in the
same run, and the machine's drift between runs does not swamp the effect.

The dashboards are minimal keep-alive HTTP clients in a thread of this
process under SCHED_IDLE (they stand for browsers on other machines), so
that on a machine whose cores all train, the figure shows the server's cost
rather than the load generator's; their own CPU time, and the rate of
answers they got (the load the server really carried), are printed
alongside.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import selectors
import socket
import statistics
import threading
import time
from dataclasses import dataclass, field

import psutil

from bench._runs import bench_parser, local_cluster, run_orchestrated
from cli.cluster import SERVER_NICE, LocalCluster
from ddpo.schemas import JobSpec, MetricPoint, MetricsPublic

DASHBOARDS = 50
# A span of training counts once the window it is in has been open this
# long: the answers to the window before are out by then.
SETTLE_S = 0.3
POLLING = "50 polling /jobs/{id}"
PAGES = "50 job pages"
# --compare-open: the same polling against a server with tokens and one without.
POLLING_TOKENS = "50 polling, tokens"
POLLING_OPEN = "50 polling, no tokens"


@dataclass
class Load:
    requests: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)


class _Page:
    """One dashboard's keep-alive connection: a request when due, then its
    answer read off the socket."""

    def __init__(
        self, port: int, job_id: int, full_page: bool, first_due: float, token: str | None
    ) -> None:
        # Dashboards present a read token, as they do on any server with tokens.
        self.auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setblocking(False)
        self.job_id = job_id
        self.full_page = full_page
        self.due = first_due
        self.tick = 0
        self.queue: list[bytes] = []  # requests of this tick not yet sent
        self.sent_at = 0.0
        self.buffer = b""

    def start_tick(self) -> None:
        paths = [f"/jobs/{self.job_id}"]
        if self.full_page and self.tick % 3 == 0:
            paths += [
                f"/jobs/{self.job_id}/metrics?max_points=500",
                f"/jobs/{self.job_id}/logs?tail=100",
            ]
        self.queue = [
            f"GET {path} HTTP/1.1\r\nHost: bench\r\n{self.auth}\r\n".encode() for path in paths
        ]
        self.tick += 1
        self.due += 1.0
        self.send_next()

    def send_next(self) -> None:
        self.sent_at = time.perf_counter()
        self.sock.sendall(self.queue.pop(0))

    def read(self, load: Load) -> None:
        """Whatever arrived; a complete answer is counted, then the tick's
        next request goes out."""
        self.buffer += self.sock.recv(1 << 20)
        head_end = self.buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = self.buffer[:head_end]
        length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        if len(self.buffer) < head_end + 4 + length:
            return
        self.buffer = self.buffer[head_end + 4 + length :]
        load.latencies.append(time.perf_counter() - self.sent_at)
        load.requests += 1
        load.errors += int(head.split(b" ", 2)[1]) != 200
        if self.queue:
            self.send_next()


class Dashboards:
    """50 dashboards on one job, in a thread of their own, until stopped,
    polling in every other window of ``window_s`` seconds from ``origin``
    and silent in between, keeping their connections open. Window 0 is left
    out of the comparison (the training is warming up: its first spans are
    slow whether watched or not); after it, odd windows poll and even ones
    are quiet, or the other way round (``polls_odd``: the benchmark swaps
    them every other run, so that a drift within a run favours neither).

    They stand for browsers on other machines, so the thread is cheap (one
    selector, no event loop) and runs under SCHED_IDLE: it gets the CPU only
    when the training leaves it some, so what is measured is the server's
    cost rather than the load generator's. Whether the load was still
    delivered is checked from the count of answers (``rate``)."""

    def __init__(
        self,
        port: int,
        job_id: int,
        full_page: bool,
        window_s: float,
        polls_odd: bool,
        token: str | None,
    ) -> None:
        self.load = Load()
        self.cpu_s = 0.0
        self.window_s = window_s
        self.polls_odd = polls_odd
        self.origin = 0.0
        self._ended = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(port, job_id, full_page, token), daemon=True
        )

    def window(self, at: float) -> int:
        """Which window a moment (``time.time()``) falls in."""
        return int((at - self.origin) // self.window_s)

    def polls_in(self, window: int) -> bool:
        return window >= 1 and (window % 2 == 1) == self.polls_odd

    def _run(self, port: int, job_id: int, full_page: bool, token: str | None) -> None:
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))
        cpu_started = time.thread_time()
        # Opened at different moments, as people open pages.
        pages = [
            _Page(port, job_id, full_page, self.origin + i / DASHBOARDS, token)
            for i in range(DASHBOARDS)
        ]
        selector = selectors.DefaultSelector()
        for page in pages:
            selector.register(page.sock, selectors.EVENT_READ, page)
        try:
            while not self._stop.is_set():
                now = time.time()
                for page in pages:
                    if page.due <= now and not page.queue:
                        if self.polls_in(self.window(now)):
                            page.start_tick()
                        else:
                            page.due += 1.0  # a silent window: skip this second
                wait = max(0.0, min(page.due for page in pages) - time.time())
                for key, _ in selector.select(min(wait, 0.1)):
                    key.data.read(self.load)
        finally:
            selector.close()
            for page in pages:
                page.sock.close()
            self.cpu_s = time.thread_time() - cpu_started

    def rate(self) -> float:
        """Answers a second while polling."""
        polling = sum(
            max(0.0, min(self._ended, start + self.window_s) - start)
            for start in (
                self.origin + k * self.window_s
                for k in range(1, self.window(self._ended) + 1)
                if self.polls_in(k)
            )
        )
        return self.load.requests / max(polling, 1e-9)

    def __enter__(self) -> Dashboards:
        self.origin = time.time()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ended = time.time()
        self._stop.set()
        self._thread.join(30)


@dataclass
class Speeds:
    """Batches trained and seconds taken, while polled and while not."""

    polled_batches: int = 0
    polled_s: float = 0.0
    quiet_batches: int = 0
    quiet_s: float = 0.0

    def add(self, other: Speeds) -> None:
        self.polled_batches += other.polled_batches
        self.polled_s += other.polled_s
        self.quiet_batches += other.quiet_batches
        self.quiet_s += other.quiet_s

    def slowdown(self) -> float:
        """Quiet speed / polled speed: 1.03 is 3% slower while polled."""
        return (self.quiet_batches / self.quiet_s) / (self.polled_batches / self.polled_s)


def speeds(points: list[MetricPoint], dashboards: Dashboards, settle_s: float) -> Speeds:
    """Rank 0's batches a second between consecutive progress reports,
    counting only the spans that lie inside one window and begin
    ``settle_s`` after it opened (the polling of the window before has
    drained)."""
    result = Speeds()
    for before, after in itertools.pairwise(points):
        start, end = before.at.timestamp(), after.at.timestamp()
        window = dashboards.window(start)
        if (
            window < 1
            or dashboards.window(end) != window
            or start - (dashboards.origin + window * dashboards.window_s) < settle_s
        ):
            continue
        batches = after.step - before.step
        if dashboards.polls_in(window):
            result.polled_batches += batches
            result.polled_s += end - start
        else:
            result.quiet_batches += batches
            result.quiet_s += end - start
    return result


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--window",
        type=float,
        default=2.0,
        help="seconds the dashboards poll, then are silent, in turn (default 2)",
    )
    parser.add_argument(
        "--server-nice",
        type=int,
        default=None,
        help="the server's nice value (default: local clusters' own, "
        f"{SERVER_NICE}; 0 to compare with the server at the training's priority)",
    )
    parser.add_argument(
        "--compare-open",
        action="store_true",
        help="instead: 50 polling clients against a server with tokens and against one "
        "without, both up throughout, taking turns (what checking tokens costs)",
    )
    args = parser.parse_args(argv)
    spec = JobSpec()
    ways = (POLLING_TOKENS, POLLING_OPEN) if args.compare_open else (POLLING, PAGES)
    # way -> per run: its dashboards, the speeds measured, the server's CPU time
    runs: dict[str, list[tuple[Dashboards, Speeds, float]]] = {way: [] for way in ways}
    with contextlib.ExitStack() as stack:
        if args.compare_open:
            clusters = {
                POLLING_TOKENS: stack.enter_context(local_cluster(args.data_dir)),
                POLLING_OPEN: stack.enter_context(local_cluster(args.data_dir, secure=False)),
            }
        else:
            shared = stack.enter_context(local_cluster(args.data_dir))
            clusters = {way: shared for way in ways}
        for cluster, _ in clusters.values():
            assert cluster.server is not None
            if args.server_nice is not None:
                psutil.Process(cluster.server.process.pid).nice(args.server_nice)
        for index in range(args.rounds):
            for way in ways if index % 2 == 0 else ways[::-1]:
                cluster, client = clusters[way]
                assert cluster.server is not None
                server = psutil.Process(cluster.server.process.pid)
                opened: dict[int, Dashboards] = {}

                def watch(
                    job_id: int,
                    way: str = way,
                    opened: dict[int, Dashboards] = opened,
                    polls_odd: bool = index % 2 == 0,
                    cluster: LocalCluster = cluster,
                ) -> Dashboards:
                    opened[job_id] = Dashboards(
                        cluster.port,
                        job_id,
                        way == PAGES,
                        args.window,
                        polls_odd,
                        cluster.tokens.read if cluster.tokens else None,
                    )
                    return opened[job_id]

                before = server.cpu_times()
                run = run_orchestrated(spec, client, way, watch=watch)
                after = server.cpu_times()
                [(job_id, watching)] = opened.items()
                metrics = MetricsPublic.model_validate(
                    client.get(f"/jobs/{job_id}/metrics", params={"max_points": 10_000}).json()
                )
                measured = speeds(metrics.points, watching, settle_s=SETTLE_S)
                server_cpu = (after.user + after.system) - (before.user + before.system)
                runs[way].append((watching, measured, server_cpu))
                print(
                    f"round {index + 1} {way:<22} training {run.train_s or 0:5.1f} s, "
                    f"accuracy {100 * (run.accuracy or 0):.2f}%: "
                    f"{measured.quiet_batches / measured.quiet_s:5.1f} batches/s quiet, "
                    f"{measured.polled_batches / measured.polled_s:5.1f} polled, "
                    f"slowdown {measured.slowdown():.3f}",
                    flush=True,
                )

    print()
    for way in ways:
        pooled = Speeds()
        for _, measured, _ in runs[way]:
            pooled.add(measured)
        per_run = [measured.slowdown() for _, measured, _ in runs[way]]
        dashboards = [d for d, _, _ in runs[way]]
        latencies = sorted(x for d in dashboards for x in d.load.latencies)
        print(
            f"{way:<22} slowdown {pooled.slowdown():.3f} over {len(per_run)} runs "
            f"({pooled.polled_s:.0f} s polled, {pooled.quiet_s:.0f} s quiet); by run: "
            + " ".join(f"{x:.3f}" for x in per_run)
            + f" (median {statistics.median(per_run):.3f})"
        )
        print(
            f"{'':<22} {sum(d.load.requests for d in dashboards)} requests "
            f"({sum(d.load.errors for d in dashboards)} errors), "
            f"{statistics.mean(d.rate() for d in dashboards):.1f} answers a second while "
            f"polling, latency p50 {1000 * latencies[len(latencies) // 2]:.1f} ms, "
            f"p99 {1000 * latencies[int(len(latencies) * 0.99)]:.1f} ms; CPU a run: server "
            f"{statistics.mean(s for _, _, s in runs[way]):.2f} s, the 50 clients "
            f"{statistics.mean(d.cpu_s for d in dashboards):.2f} s"
        )


if __name__ == "__main__":
    main()
