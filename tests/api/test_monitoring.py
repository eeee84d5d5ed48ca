"""``GET /metrics``: Prometheus's own parser reads it, and what it says about
jobs, nodes and claims is what the database holds."""

from __future__ import annotations

import threading
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text

from tests.api.conftest import ProtocolNode, ThreadedServer, wait_for


def scrape(client: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_job_node_and_claim_counts_match_the_database(
    server: ThreadedServer, client: httpx.Client
) -> None:
    a, b = ProtocolNode(client, "a"), ProtocolNode(client, "b")
    ids = [client.post("/jobs", json={}).json()["id"] for _ in range(5)]
    started = a.poll()["start"] + b.poll()["start"]  # two of them start
    assert len(started) == 2
    client.post(f"/jobs/{ids[-1]}/cancel").raise_for_status()  # one queued one cancelled
    # One node goes silent and is declared lost by hand, as the sweep would.
    engine = create_engine(server.settings.database_url)
    with engine.begin() as db:
        db.execute(text("UPDATE node SET state = 'lost' WHERE name = 'b'"))

    metrics = scrape(client)
    with engine.connect() as db:
        jobs = dict(db.execute(text("SELECT status, COUNT(*) FROM job GROUP BY status")).all())
        nodes = dict(db.execute(text("SELECT state, COUNT(*) FROM node GROUP BY state")).all())
        parts = db.execute(text("SELECT COUNT(*) FROM part")).scalar_one()
    engine.dispose()
    assert jobs == {"queued": 2, "running": 2, "cancelled": 1}
    for status in ("queued", "running", "succeeded", "failed", "cancelling", "cancelled"):
        assert metrics[("ddpo_jobs", (("state", status),))] == jobs.get(status, 0)
    assert metrics[("ddpo_queue_length", ())] == jobs["queued"]
    assert metrics[("ddpo_nodes", (("state", "live"),))] == nodes["live"] == 1
    assert metrics[("ddpo_nodes", (("state", "lost"),))] == nodes["lost"] == 1
    assert metrics[("ddpo_claims_total", ())] == parts == 2


def test_request_latency_is_recorded_by_route_template(client: httpx.Client) -> None:
    job_id = client.post("/jobs", json={}).json()["id"]
    for _ in range(3):
        client.get(f"/jobs/{job_id}").raise_for_status()
    client.get("/jobs/999999")
    metrics = scrape(client)
    key = "ddpo_http_request_duration_seconds_count"
    ok = (("method", "GET"), ("route", "/jobs/{job_id}"), ("status", "200"))
    missing = (("method", "GET"), ("route", "/jobs/{job_id}"), ("status", "404"))
    assert metrics[(key, ok)] == 3
    assert metrics[(key, missing)] == 1
    assert not any("999999" in str(labels) for _, labels in metrics)


def test_the_write_locks_use_is_counted_its_holds_and_the_waits_behind_them(
    server: ThreadedServer, client: httpx.Client
) -> None:
    def lock_figures() -> tuple[float, float, float]:
        metrics = scrape(client)
        return (
            metrics[("ddpo_write_transactions_total", ())],
            metrics[("ddpo_write_lock_waited_seconds_total", ())],
            metrics[("ddpo_write_lock_held_seconds_total", ())],
        )

    transactions0, waited0, held0 = lock_figures()
    core = server.app_core()
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with core.db.write():
            holding.set()
            assert release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(10)
    submits = [threading.Thread(target=lambda: client.post("/jobs", json={})) for _ in range(2)]
    for submit in submits:
        submit.start()
    # One submit writes the next group (blocked behind the holder, taking
    # its group once it holds the lock), the other waits for it.
    wait_for(
        lambda: core.writes._writing and core.writes.waiting == 2,
        what="the submits waiting behind the holder",
    )
    blocked = time.perf_counter()
    # Held for a known span more, not to synchronise: the figures must
    # count at least that long a hold, and as long a wait behind it.
    release.wait(HOLD_S)
    span = time.perf_counter() - blocked
    release.set()
    for thread in [holder, *submits]:
        thread.join(10)
    transactions, waited, held = lock_figures()
    assert transactions >= transactions0 + 2  # the holder's, and the submits' group(s)
    assert held - held0 >= span
    # The group's writer met the lock at about the moment it was seen
    # waiting (half: a loaded machine may run it a little later).
    assert waited - waited0 >= span / 2


HOLD_S = 0.3
