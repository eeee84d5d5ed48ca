"""The control plane with thousands of simulated nodes (bench/fleet.py): on
SQLite with one server, and on PostgreSQL with one and with two servers
sharing the database.

    python -m bench.control_plane --nodes 1000 5000 \\
        --postgres-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres
    python -m bench.control_plane --nodes 5000 --cases postgresql:2 \\
        --postgres-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres

For each case, in one run: registrations a second (32 at a time); with
every node idle (long-polling and beating), the servers' CPU per 1,000
nodes and the p50/p99 of polls beyond their wait, of heartbeats and of
``GET /jobs/{id}`` (10 a second, as dashboards ask); then placements a
second: 1,000 single-machine jobs, 16 submits in flight at a time
(``--submitters``), from the first submit
until the last has succeeded, or those that did within 90 s (the
nodes report each part started and finished at once), and meanwhile how
much of the time the write lock was held, summed over the servers (their
``/metrics``: one writer at a time across them, so 100% is all it can
give), and for how long a transaction on average, and the CPU the
servers used and the whole machine's busy cores meanwhile (a writer slowed
for want of CPU holds the lock longer). Finally, how many
nodes the servers marked lost (every node kept polling: any is wrongly
lost).

The servers run with a large cluster's timing (``--heartbeat-timeout`` 30
s, ``--poll-wait`` 10 s: an idle node asks once every 10 s, its held poll
standing for its heartbeat); the simulated
nodes share this machine's cores with the servers (their own CPU is
reported too). ``--postgres-url`` names a PostgreSQL server on which a new
database is made for each case (and dropped after); without it, only
SQLite runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import make_url

from bench.fleet import Fleet, Latencies
from cli.cluster import LocalCluster

PLACED_JOBS = 1000
# Placements a second are counted over this long at most (the jobs that
# succeeded by then), so a slow case does not hold the run for long.
PLACEMENT_DEADLINE_S = 90.0
# Measured from this long after the nodes start: each has polled once
# (their first polls are spread over one wait) and been answered.
WARM_S = 5.0


@dataclass
class Case:
    database: str  # "sqlite" or "postgresql"
    servers: int
    # Submits in flight at once while placing: each is answered once its
    # job is planned, so this is the load offered (--submitters).
    submitters: int = 16


@dataclass
class Figures:
    case: str
    nodes: int
    registrations_per_s: float
    idle_cpu_per_1000: float
    fleet_cpu: float
    poll_p50_ms: float
    poll_p99_ms: float
    heartbeat_p99_ms: float
    job_get_p50_ms: float
    job_get_p99_ms: float
    placements_per_s: float
    lost: int
    errors: int
    # While placing: the servers' held write lock over the wall time (summed:
    # one writer at a time across them), and writes per held transaction.
    lock_held: float = 0.0
    lock_hold_ms: float = 0.0
    # While placing: the servers' CPU (cores, summed) and the whole
    # machine's busy cores (the servers, PostgreSQL, the simulated fleet):
    # with the lock held nearly all the time, whether the writer is slow
    # for want of CPU (BENCHMARKS.md, placements at 5,000 nodes).
    placing_server_cores: float = 0.0
    placing_machine_cores: float = 0.0


@contextlib.contextmanager
def fresh_postgres(admin_url: str) -> Iterator[str]:
    import psycopg

    name = f"ddpo_bench_{uuid.uuid4().hex[:12]}"
    libpq = make_url(admin_url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(libpq, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(admin_url).set(database=name).render_as_string(False)
    finally:
        with psycopg.connect(libpq, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def measure(
    case: Case,
    nodes: int,
    database_url: str | None,
    window_s: float,
    heartbeat_timeout_s: float,
    poll_wait_s: float,
) -> Figures:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(
            state_dir=Path(tmp) / "cluster",
            data_dir=Path(tmp),
            workers=0,
            database=database_url,
            replicas=case.servers,
            server_env={
                "DDPO_NICE": "0",
                "DDPO_MAX_NODES": str(nodes),
                "DDPO_REGISTRATIONS_PER_MINUTE": str(100 * nodes),
                "DDPO_HEARTBEAT_TIMEOUT_S": str(heartbeat_timeout_s),
                "DDPO_POLL_WAIT_S": str(poll_wait_s),
                "DDPO_MAX_CONNECTIONS": str(2 * nodes + 256),
                # Every simulated node is on this host's loopback address.
                "DDPO_CONNECTIONS_PER_ADDRESS": str(2 * nodes + 256),
                "DDPO_LOG_LEVEL": "warning",
            },
        )
        with cluster:
            try:
                return asyncio.run(_measure(cluster, case, nodes, window_s))
            except Exception:
                for server in cluster.replica_processes:
                    print(f"--- {server.name}'s log ends:\n{server.log_tail(4000)}")
                raise


async def _measure(cluster: LocalCluster, case: Case, nodes: int, window_s: float) -> Figures:
    assert cluster.tokens is not None
    urls = [cluster.replica_url(i) for i in range(case.servers)]
    servers = [psutil.Process(p.process.pid) for p in cluster.replica_processes]
    fleet = Fleet(urls, nodes, cluster.tokens.join)
    registered_s = await fleet.register()
    user = cluster.headers("user")
    async with httpx.AsyncClient(timeout=60, headers=user) as client:
        # One job no node can run (a trainer none offers): what dashboards watch.
        watched = await client.post(f"{urls[0]}/jobs", json={"trainer": "absent"})
        job_url = f"/jobs/{watched.raise_for_status().json()['id']}"
        await asyncio.sleep(fleet.poll_wait_s + WARM_S)
        fleet.latencies.clear()
        gets = Latencies()
        cpu0 = _cpu(servers)
        own0 = _own_cpu()
        wall0 = time.perf_counter()
        deadline = wall0 + window_s
        turn = 0
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            answer = await client.get(urls[turn % len(urls)] + job_url)
            if answer.status_code == 200:
                gets.add("job", time.perf_counter() - started)
            else:
                gets.failed("job")
            turn += 1
            await asyncio.sleep(max(0.0, 0.1 - (time.perf_counter() - started)))
        wall = time.perf_counter() - wall0
        cpu = _cpu(servers) - cpu0
        fleet_cpu = (_own_cpu() - own0) / wall
        idle = fleet.latencies
        poll_p50, poll_p99 = idle.percentile("poll", 0.5), idle.percentile("poll", 0.99)
        beat_p99 = idle.percentile("heartbeat", 0.99)
        errors = sum(idle.errors.values()) + sum(gets.errors.values())

        fleet.latencies.clear()
        lock0 = await _write_lock(client, urls)
        server_cpu0, machine0 = _cpu(servers), _machine_busy_s()
        placing0 = time.perf_counter()
        placements_per_s = await _placements(client, urls, case.submitters)
        placing_s = time.perf_counter() - placing0
        server_cores = (_cpu(servers) - server_cpu0) / placing_s
        machine_cores = (_machine_busy_s() - machine0) / placing_s
        transactions, held_s = (
            b - a for a, b in zip(lock0, await _write_lock(client, urls), strict=True)
        )
        if fleet.latencies.errors:
            print(f"requests refused or lost while placing: {fleet.latencies.errors}", flush=True)
        lost = (await client.get(f"{urls[0]}/nodes", params={"state": "lost"})).json()["count"]
    await fleet.stop()
    return Figures(
        case=f"{case.database}, {case.servers} server{'s' if case.servers > 1 else ''}",
        nodes=nodes,
        registrations_per_s=nodes / registered_s,
        idle_cpu_per_1000=(cpu / wall) / (nodes / 1000),
        fleet_cpu=fleet_cpu,
        poll_p50_ms=1000 * (poll_p50 or 0),
        poll_p99_ms=1000 * (poll_p99 or 0),
        heartbeat_p99_ms=1000 * (beat_p99 or 0),
        job_get_p50_ms=1000 * (gets.percentile("job", 0.5) or 0),
        job_get_p99_ms=1000 * (gets.percentile("job", 0.99) or 0),
        placements_per_s=placements_per_s,
        lost=int(lost),
        errors=errors,
        lock_held=held_s / placing_s,
        lock_hold_ms=1000 * held_s / max(1.0, transactions),
        placing_server_cores=server_cores,
        placing_machine_cores=machine_cores,
    )


def _cpu(processes: list[psutil.Process]) -> float:
    """CPU seconds (user and system) the processes have used."""
    return float(sum(sum(p.cpu_times()[:2]) for p in processes))


def _machine_busy_s() -> float:
    """CPU seconds every core of this machine has been busy (not idle or
    waiting on I/O)."""
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


async def _write_lock(client: httpx.AsyncClient, urls: list[str]) -> tuple[float, float]:
    """Write transactions and seconds the write lock was held, summed over
    the servers (their ``/metrics``)."""
    transactions = held_s = 0.0
    for url in urls:
        text = (await client.get(f"{url}/metrics")).raise_for_status().text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "ddpo_write_transactions_total":
                    transactions += sample.value
                elif sample.name == "ddpo_write_lock_held_seconds_total":
                    held_s += sample.value
    return transactions, held_s


async def _placements(client: httpx.AsyncClient, urls: list[str], submitters: int) -> float:
    """1,000 single-machine jobs, ``submitters`` submits at a time across the servers:
    jobs a second from the first submit until the last has succeeded (or
    those that succeeded within PLACEMENT_DEADLINE_S)."""
    started = time.perf_counter()
    queue = list(range(PLACED_JOBS))

    async def submitting(lane: int) -> None:
        while queue and time.perf_counter() - started < PLACEMENT_DEADLINE_S:
            index = queue.pop()
            for attempt in range(3):
                try:
                    # A keep-alive connection the server closed as it was
                    # reused: sent again, once more at most, under its key.
                    answer = await client.post(
                        f"{urls[(index + attempt) % len(urls)]}/jobs",
                        json={"name": f"placed-{index}", "max_steps_per_epoch": 1},
                        headers={"Idempotency-Key": f"placed-{index}"},
                    )
                    break
                except httpx.TransportError:
                    if attempt == 2:
                        raise
            answer.raise_for_status()

    await asyncio.gather(*(submitting(lane) for lane in range(submitters)))
    while True:
        page = await client.get(f"{urls[0]}/jobs", params={"status": "succeeded", "limit": 1})
        if page.json()["count"] >= PLACED_JOBS:
            return PLACED_JOBS / (time.perf_counter() - started)
        elapsed = time.perf_counter() - started
        if elapsed > PLACEMENT_DEADLINE_S:
            counts = {
                status: (
                    await client.get(f"{urls[0]}/jobs", params={"status": status, "limit": 1})
                ).json()["count"]
                for status in ("queued", "running", "succeeded", "failed")
            }
            print(f"after {elapsed:.0f} s, of {PLACED_JOBS} jobs: {counts}", flush=True)
            return counts["succeeded"] / elapsed
        await asyncio.sleep(0.2)


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--postgres-url", help="a PostgreSQL server to make databases on")
    parser.add_argument("--window", type=float, default=20.0, help="idle seconds measured")
    parser.add_argument("--heartbeat-timeout", type=float, default=30.0)
    parser.add_argument("--poll-wait", type=float, default=10.0)
    parser.add_argument(
        "--submitters", type=int, default=16, help="submits in flight at once while placing"
    )
    parser.add_argument(
        "--cases",
        nargs="+",
        choices=["sqlite", "postgresql:1", "postgresql:2"],
        help="which cases (default: SQLite, and both PostgreSQL ones with --postgres-url)",
    )
    args = parser.parse_args()
    both = ["postgresql:1", "postgresql:2"] if args.postgres_url else []
    names = args.cases or ["sqlite", *both]
    cases = [
        Case(n.split(":")[0], int(n.split(":")[1]) if ":" in n else 1, args.submitters)
        for n in names
    ]
    if any(case.database == "postgresql" for case in cases) and not args.postgres_url:
        parser.error("the PostgreSQL cases need --postgres-url")
    rows = []
    for nodes in args.nodes:
        for case in cases:
            with contextlib.ExitStack() as stack:
                url = (
                    stack.enter_context(fresh_postgres(args.postgres_url))
                    if case.database == "postgresql"
                    else None
                )
                figures = measure(
                    case, nodes, url, args.window, args.heartbeat_timeout, args.poll_wait
                )
            print(figures, flush=True)
            rows.append(figures)
    print(
        "\n| case | nodes | registrations/s | idle server CPU per 1,000 nodes | fleet CPU "
        "| poll p50 / p99 beyond wait | heartbeat p99 | GET /jobs/{id} p50 / p99 "
        "| placements/s | write lock held while placing (per transaction) "
        "| CPU while placing: servers, machine (of its cores) | lost | errors |"
        "\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    for r in rows:
        print(
            f"| {r.case} | {r.nodes} | {r.registrations_per_s:.0f} | "
            f"{100 * r.idle_cpu_per_1000:.1f}% | {100 * r.fleet_cpu:.0f}% | "
            f"{r.poll_p50_ms:.1f} / {r.poll_p99_ms:.1f} ms | {r.heartbeat_p99_ms:.1f} ms | "
            f"{r.job_get_p50_ms:.1f} / {r.job_get_p99_ms:.1f} ms | {r.placements_per_s:.0f} | "
            f"{100 * r.lock_held:.0f}% ({r.lock_hold_ms:.0f} ms) | "
            f"{r.placing_server_cores:.2f}, {r.placing_machine_cores:.2f} ({psutil.cpu_count()}) | "
            f"{r.lost} | {r.errors} |"
        )


if __name__ == "__main__":
    main()
