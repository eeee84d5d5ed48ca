"""Sixteen real worker daemons on one server, 200 single-machine jobs: every
job is claimed once, none is left behind, and no client ever sees the
database being busy. In CI's PostgreSQL lane: on two servers sharing the
database, the workers split between them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from cli.cluster import LocalCluster
from tests.conftest import REPO
from tests.databases import fresh_database_url, on_postgres
from tests.e2e.conftest import record, until

pytestmark = pytest.mark.e2e

WORKERS = 16
JOBS = 200
BUSY_SIGNS = ("database is locked", "database is busy", "Traceback", " 500 ", " 503 ")
REPLICAS = 2 if on_postgres() else 1


def test_16_workers_claim_200_jobs_exactly_once(tmp_path: Path) -> None:
    empty_data = tmp_path / "no-data"  # the noop trainer reads nothing; nothing to warm
    empty_data.mkdir()
    cluster = LocalCluster(
        state_dir=tmp_path / "cluster",
        data_dir=empty_data,
        workers=WORKERS,
        extra_env={"PYTHONPATH": str(REPO)},
        worker_args=["--trainer", "noop=tests.e2e.trainers:NOOP"],
        database=fresh_database_url(tmp_path),
        replicas=REPLICAS,
        # Sixteen daemons, their fork servers, launchers and ranks on a
        # 2-core machine: a daemon can sit for several seconds in one
        # launch, sending nothing (RELIABILITY.md, known limits). This test
        # is about claims; liveness is what tests/e2e/test_faults.py tests.
        server_env={"DDPO_NICE": "0", "DDPO_HEARTBEAT_TIMEOUT_S": "30"},
    )
    try:
        cluster.start(timeout_s=300)  # sixteen torch imports on a small machine
        with cluster.client(timeout_s=60) as client:
            started = time.monotonic()
            for index in range(JOBS):
                response = client.post("/jobs", json={"trainer": "noop", "name": f"load {index}"})
                assert response.status_code == 201, response.text

            def all_ended() -> bool:
                page = client.get("/jobs", params={"limit": 500}).json()["data"]
                return all(j["status"] in ("succeeded", "failed", "cancelled") for j in page)

            until(all_ended, 600, f"{JOBS} jobs to end")
            took_s = time.monotonic() - started
            page = client.get("/jobs", params={"limit": 500}).json()["data"]
        assert len(page) == JOBS
        assert {j["status"] for j in page} == {"succeeded"}, [
            (j["id"], j["status"], j["error"]) for j in page if j["status"] != "succeeded"
        ]
        engine = create_engine(cluster.database_url)
        with engine.connect() as db:
            claims = db.execute(text("SELECT job_id, COUNT(*) FROM part GROUP BY job_id")).all()
            nodes_used = db.execute(text("SELECT COUNT(DISTINCT node_id) FROM part")).scalar()
        engine.dispose()
        assert len(claims) == JOBS and {count for _, count in claims} == {1}
        # Each server answered its workers' polls, where claims are made.
        polls_by_server = [
            polls_served(cluster.replica_url(i), cluster.headers("read")) for i in range(REPLICAS)
        ]
        assert all(served > 0 for served in polls_by_server), polls_by_server
        logs = {p.name: p.read_text(errors="replace") for p in cluster.state_dir.glob("*.log")}
        surfaced = {
            name: sign for name, text in logs.items() for sign in BUSY_SIGNS if sign in text
        }
        assert surfaced == {}, surfaced
        record(
            f"{WORKERS} worker daemons, {JOBS} queued single-machine jobs, "
            f"{REPLICAS} server(s) on {engine.dialect.name}",
            jobs_succeeded=len(page),
            duplicate_claims=sum(count - 1 for _, count in claims),
            nodes_used=nodes_used,
            seconds=round(took_s, 1),
            polls_by_server=polls_by_server,
        )
        print(json.dumps({"jobs_per_s": round(JOBS / took_s, 2), "nodes_used": nodes_used}))
    finally:
        cluster.stop()


def polls_served(url: str, headers: dict[str, str]) -> float:
    """How many polls (where claims are made) this server answered."""
    metrics = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("ddpo_http_request_duration_seconds_count")
        and 'route="/nodes/{node_id}/poll"' in line
    )
