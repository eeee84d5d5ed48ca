"""Two servers on one PostgreSQL database serve as one: what is written
through one is what the other answers (its cached answers included), a
long-poll on one wakes for a job submitted or cancelled through the other,
a node revoked through one is refused by the other at once, and one of
them sweeps at a time. (PostgreSQL only: SQLite has one server per file.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from db.changes import SweepLease
from tests.api.conftest import ProtocolNode, ThreadedServer, bearer, make_settings, wait_for
from tests.databases import on_postgres

pytestmark = pytest.mark.skipif(
    not on_postgres(), reason="several servers share a PostgreSQL database (CI's PostgreSQL lane)"
)

ADMIN = "admin-3d8f1a6c-Qw2e9Rt5Yu"
USER = "user-6b2c9e4a-Lk8j3Hg1Fd"
JOIN = "join-1e7a5c3b-Zx4c7Vb2Nm"


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    first = make_settings(
        tmp_path,
        poll_wait_s=30.0,
        heartbeat_timeout_s=60.0,
        sweep_interval_s=0.2,
        admin_token=ADMIN,
        user_token=USER,
        join_token=JOIN,
    )
    second = first.model_copy(update={"port": make_settings(tmp_path).port})
    with (
        ThreadedServer(first) as a,
        ThreadedServer(second) as b,
        httpx.Client(base_url=a.url, timeout=30) as on_a,
        httpx.Client(base_url=b.url, timeout=30) as on_b,
    ):
        yield on_a, on_b


def submit(client: httpx.Client, **spec: Any) -> int:
    job = client.post("/jobs", json=spec, headers=bearer(USER)).raise_for_status().json()
    job_id: int = job["id"]
    return job_id


def status(client: httpx.Client, job_id: int) -> str:
    answer = client.get(f"/jobs/{job_id}", headers=bearer(USER)).raise_for_status().json()
    return str(answer["status"])


def test_a_cached_answer_on_one_server_is_never_older_than_a_write_through_the_other(
    replicas: tuple[httpx.Client, httpx.Client],
) -> None:
    on_a, on_b = replicas
    job_id = submit(on_a, max_steps_per_epoch=5)
    assert status(on_b, job_id) == "queued"  # now cached on B
    assert status(on_b, job_id) == "queued"
    on_a.post(f"/jobs/{job_id}/cancel", headers=bearer(USER)).raise_for_status()
    # Within the time a note takes to cross (milliseconds), well before
    # the cache's own second.
    started = time.monotonic()
    wait_for(lambda: status(on_b, job_id) == "cancelled", 0.9, "B to see the cancel")
    assert time.monotonic() - started < 0.9


def last_polled(client: httpx.Client, name: str) -> datetime:
    nodes = client.get("/nodes", headers=bearer(USER)).raise_for_status().json()["data"]
    return datetime.fromisoformat(next(n for n in nodes if n["name"] == name)["last_heartbeat_at"])


def held_poll(node: ProtocolNode, **poll: Any) -> tuple[threading.Thread, list[dict[str, Any]]]:
    """A poll held open (30 s) on the node's server, waiting by the time this returns."""
    answers: list[dict[str, Any]] = []
    poller = threading.Thread(target=lambda: answers.append(node.poll(wait_s=30.0, **poll)))
    since = last_polled(node.client, node.name)
    poller.start()
    wait_for(lambda: last_polled(node.client, node.name) > since, what="the poll to be waiting")
    return poller, answers


def test_a_long_poll_on_one_server_wakes_for_a_submit_and_a_cancel_through_the_other(
    replicas: tuple[httpx.Client, httpx.Client],
) -> None:
    on_a, on_b = replicas
    node = ProtocolNode(on_b, "node-b", JOIN)
    poller, answers = held_poll(node)
    job_id = submit(on_a, max_steps_per_epoch=5)
    poller.join(10)  # of its 30 s: only a poll woken by the news answers in time
    assert not poller.is_alive(), "B's poll was not woken by the job submitted through A"
    [assignment] = answers[0]["start"]
    assert assignment["job_id"] == job_id

    part_id = assignment["part_id"]
    node.client.post(
        f"/parts/{part_id}/started", json={"node_id": node.node_id}, headers=node.headers
    ).raise_for_status()
    poller, answers = held_poll(node, active=[part_id])
    on_a.post(f"/jobs/{job_id}/cancel", headers=bearer(USER)).raise_for_status()
    poller.join(2)  # the done-when's bound for a cancel to reach a node on the other server
    assert not poller.is_alive(), "B's poll was not woken by the cancel sent to A"
    assert answers[0]["stop"] == [part_id]


def test_a_node_revoked_through_one_server_is_refused_by_the_other_at_once(
    replicas: tuple[httpx.Client, httpx.Client],
) -> None:
    on_a, on_b = replicas
    node = ProtocolNode(on_a, "node-a", JOIN)
    # Its credential works on B at once: B looks a credential it has not
    # heard of yet up in the database.
    took = on_b.post(
        f"/nodes/{node.node_id}/heartbeat", json={"active_part_ids": []}, headers=node.headers
    )
    assert took.status_code == 200, took.text
    on_a.post(f"/nodes/{node.node_id}/revoke", headers=bearer(ADMIN)).raise_for_status()
    refused = on_b.post(
        f"/nodes/{node.node_id}/heartbeat", json={"active_part_ids": []}, headers=node.headers
    )
    # "At once": the revoke's answer came after its commit; B heard the note
    # within milliseconds, or refuses from the database's row (403) anyway.
    assert refused.status_code in (401, 403), refused.text
    wait_for(
        lambda: (
            on_b.post(
                f"/nodes/{node.node_id}/heartbeat",
                json={"active_part_ids": []},
                headers=node.headers,
            ).status_code
            == 401
        ),
        1,
        "B to refuse the credential itself",
    )


def test_a_key_made_through_one_server_works_on_the_other_and_its_revocation_too(
    replicas: tuple[httpx.Client, httpx.Client],
) -> None:
    on_a, on_b = replicas
    made = on_a.post("/keys", json={"name": "alice", "role": "user"}, headers=bearer(ADMIN))
    alice = bearer(made.raise_for_status().json()["key"])
    # At once on B: it looks a key it has not heard of yet up in the database.
    submitted = on_b.post("/jobs", json={}, headers=alice)
    assert submitted.status_code == 201 and submitted.json()["owner"] == "alice"
    on_b.post(f"/keys/{made.json()['id']}/revoke", headers=bearer(ADMIN)).raise_for_status()
    assert on_b.get("/jobs", headers=alice).status_code == 401
    # A heard the note within milliseconds.
    wait_for(lambda: on_a.get("/jobs", headers=alice).status_code == 401, 1, "A to refuse it")
    actions = on_a.get("/audit", headers=bearer(ADMIN)).raise_for_status().json()["data"]
    assert [(e["actor"], e["action"]) for e in actions] == [
        ("token:admin", "key.revoke"),
        ("alice", "job.submit"),
        ("token:admin", "key.create"),
    ]


def test_one_server_sweeps_at_a_time_and_another_takes_over_when_it_goes(
    tmp_path: Path,
) -> None:
    url = make_settings(tmp_path).database_url
    first, second = SweepLease(url), SweepLease(url)
    try:
        assert first.held()
        assert not second.held()
        assert first.held()  # it keeps it
        first.release()  # a server that stops hands the lease over at once
        assert second.held()
        assert not first.held()
        # One that dies only drops its connection: PostgreSQL frees the lock
        # once that backend has ended, and the next try after it takes it.
        second._connection.close()
        wait_for(first.held, 10, "a server to take the lease a dead one held")
    finally:
        first.release()
        second.release()


def test_a_sweeper_that_falls_silent_loses_the_lease(tmp_path: Path) -> None:
    """A server that froze (or lost its host) while holding the lease: the
    database cuts its session off, and another server sweeps."""
    url = make_settings(tmp_path).database_url
    frozen, other = SweepLease(url, silence_s=0.5), SweepLease(url)
    try:
        assert frozen.held()
        assert not other.held()
        wait_for(other.held, 10, "the other server to take the lease")
        assert not frozen.held()  # it learns it lost it, and stops sweeping
    finally:
        frozen.release()
        other.release()


def test_a_node_heard_only_by_the_server_that_does_not_sweep_stays_live(
    tmp_path: Path,
) -> None:
    settings = make_settings(
        tmp_path,
        # 4 s, not less: B writes its sightings on its clock's thread, and
        # CI runs this lane beside the end-to-end tests, where one such
        # write on PostgreSQL once took longer than a 1.5 s timeout.
        heartbeat_timeout_s=4,
        poll_wait_s=0.5,
        sweep_interval_s=0.2,
        join_token=JOIN,
        user_token=USER,
    )
    with ThreadedServer(settings) as a:
        sweeper = a.server.config.app.state.db
        wait_for(lambda: sweeper.sweeping, 10, "the first server to sweep")
        other = settings.model_copy(update={"port": make_settings(tmp_path).port})
        with (
            ThreadedServer(other) as b,
            httpx.Client(base_url=a.url, timeout=10) as on_a,
            httpx.Client(base_url=b.url, timeout=10) as on_b,
        ):
            assert not b.server.config.app.state.db.sweeping
            node = ProtocolNode(on_a, "heard-by-b", JOIN)
            node.client = on_b  # from now on it speaks to B only
            # Two heartbeat timeouts of beats to B alone, as a worker sends them.
            until = time.monotonic() + 2 * settings.heartbeat_timeout_s
            while time.monotonic() < until:
                node.client.post(
                    f"/nodes/{node.node_id}/heartbeat",
                    json={"active_part_ids": []},
                    headers=node.headers,
                ).raise_for_status()
                nodes = on_a.get("/nodes", headers=bearer(USER)).raise_for_status().json()
                state = nodes["data"][0]["state"]
                assert state == "live", (
                    "the sweeping server took a node heard by the other for lost"
                )
                time.sleep(settings.heartbeat_interval_s)  # a worker's beat period, not a wait
            assert sweeper.sweeping


def test_placement_on_one_server_sees_a_node_that_joined_through_the_other_before_its_note(
    tmp_path: Path,
) -> None:
    """A server remembers the live nodes between placements; a node that
    joined through another server counts at once, whether or not the note
    of it has arrived (here it never does: A's listener is stopped)."""
    settings = make_settings(tmp_path, poll_wait_s=0.5, user_token=USER, join_token=JOIN)
    with ThreadedServer(settings) as a:
        a.server.config.app.state.db._listener.stop()  # A hears no other server from now on
        other = settings.model_copy(update={"port": make_settings(tmp_path).port})
        with (
            ThreadedServer(other) as b,
            httpx.Client(base_url=a.url, timeout=10) as on_a,
            httpx.Client(base_url=b.url, timeout=10) as on_b,
        ):
            ProtocolNode(on_b, "first", JOIN)
            submitted = on_a.post("/jobs", json={}, headers=bearer(USER)).raise_for_status()
            assert submitted.json()["status"] == "running"  # on the only node, now busy
            ProtocolNode(on_b, "second", JOIN)
            submitted = on_a.post("/jobs", json={}, headers=bearer(USER)).raise_for_status()
            assert submitted.json()["status"] == "running", submitted.json()["pending_reason"]


def test_a_sweep_goes_on_whichever_server_hears_of_its_trials(
    replicas: tuple[httpx.Client, httpx.Client],
) -> None:
    """Submitted through one server, its trials reported through the other:
    the other makes the next trials from the rows alone, and with both
    servers' clocks turning no trial number is asked twice."""
    on_a, on_b = replicas
    node = ProtocolNode(on_b, "n", join_token=JOIN, slots=2)
    body = {
        "spec": {"epochs": 1},
        "space": {"lr": {"type": "float", "low": 0.01, "high": 5, "log": True}},
        "max_trials": 6,
        "max_concurrent": 2,
        "sampler": {"kind": "random", "seed": 3},
    }
    sweep = on_a.post("/sweeps", json=body, headers=bearer(USER)).raise_for_status().json()
    for _ in range(3):  # two trials at a time, each pair ended through b

        def given() -> list[dict[str, Any]]:
            starts: list[dict[str, Any]] = node.poll(wait_s=0)["start"]
            return starts

        for start in wait_for(given, what="the next trials"):
            node.finish(start["part_id"], "succeeded", exit_code=0, result={"test_loss": 0.1})
    done = wait_for(
        lambda: (
            (s := on_a.get(f"/sweeps/{sweep['id']}", headers=bearer(USER)).json())["status"]
            == "succeeded"
            and s
        ),
        what="the sweep to end on a",
    )
    assert [t["number"] for t in done["trials"]] == list(range(6))
    assert [t["state"] for t in done["trials"]] == ["succeeded"] * 6
    assert len({t["job_id"] for t in done["trials"]}) == 6
    same = on_b.get(f"/sweeps/{sweep['id']}", headers=bearer(USER)).json()
    assert same["trials"] == done["trials"]
