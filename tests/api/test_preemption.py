"""Preemption and the cooperative stop, as the server keeps them (issue 28),
with nodes spoken for by hand: which job is asked to stop, what its nodes
are told, how its attempt ends, and that it goes back to the queue without
using a restart. tests/e2e/test_preemption.py runs the same with real
workers and real training."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import ProtocolNode, ThreadedServer, make_settings, wait_for
from tests.api.test_jobs_api import submit
from tests.api.test_retries import started


@contextlib.contextmanager
def serve(tmp_path: Path, **settings: Any) -> Iterator[httpx.Client]:
    config = make_settings(
        tmp_path,
        poll_wait_s=0.5,
        sweep_interval_s=0.1,
        artifacts_dir=tmp_path / "artifacts",
        **{"preemption_min_run_s": 0, "stop_grace_s": 300, **settings},
    )
    with ThreadedServer(config) as server, httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


@pytest.fixture
def client(tmp_path: Path) -> Iterator[httpx.Client]:
    with serve(tmp_path) as served:
        yield served


def put_stop_checkpoint(node: ProtocolNode, part_id: int, epoch: int, step: int) -> bool:
    response = node.client.put(
        f"/parts/{part_id}/checkpoint",
        params={"node_id": node.node_id, "epoch": epoch, "step": step},
        content=f"state at step {step}".encode(),
        headers={"content-type": "application/octet-stream", **node.headers},
    )
    accepted: bool = response.raise_for_status().json()["accepted"]
    return accepted


def job(client: httpx.Client, job_id: int) -> dict[str, Any]:
    found: dict[str, Any] = client.get(f"/jobs/{job_id}").raise_for_status().json()
    return found


def test_the_newest_of_the_lowest_priority_is_asked_to_stop_and_requeues_without_a_restart(
    client: httpx.Client,
) -> None:
    a, b = ProtocolNode(client, "a"), ProtocolNode(client, "b")
    older = submit(client)["id"]
    on_a = started(a)
    newer = submit(client)["id"]
    on_b = started(b)
    assert (on_a["job_id"], on_b["job_id"]) == (older, newer)

    high = submit(client, priority=5)
    assert high["status"] == "queued"
    assert high["pending"]["code"] == "preempting" and high["pending"]["preempting"] == [newer]
    assert f"preempting job {newer} " in high["pending_reason"]

    # Node b hears it on its next poll (and heartbeat); node a hears nothing.
    asked = b.poll([on_b["part_id"]])["checkpoint_and_stop"]
    assert [(r["part_id"], r["reason"], r["detail"]) for r in asked] == [
        (on_b["part_id"], "preempted", f"by job {high['id']}")
    ]
    assert 290 < asked[0]["grace_s"] <= 300
    beat = client.post(
        f"/nodes/{b.node_id}/heartbeat",
        json={"active_part_ids": [on_b["part_id"]]},
        headers=b.headers,
    ).json()
    assert [r["part_id"] for r in beat["checkpoint_and_stop"]] == [on_b["part_id"]]
    assert a.poll([on_a["part_id"]])["checkpoint_and_stop"] == []
    # Once the node says it knows, a poll waits for news again.
    again = client.post(
        f"/nodes/{b.node_id}/poll",
        json={"active_part_ids": [on_b["part_id"]], "asked_to_stop": [on_b["part_id"]]},
        headers=b.headers,
    ).json()
    assert again["checkpoint_and_stop"] == [] and again["stop"] == []
    attempt = job(client, newer)["attempts"][0]
    assert attempt["stop"]["reason"] == "preempted" and attempt["ended"] is None

    # The ranks stop after step 7 of epoch 1 and rank 0's checkpoint goes up.
    assert put_stop_checkpoint(b, on_b["part_id"], epoch=1, step=7)
    assert job(client, newer)["checkpoint"] == {
        "epoch": 0,
        "step": 7,
        "size_bytes": len(b"state at step 7"),
        "url": f"/jobs/{newer}/model",
    }
    b.finish(on_b["part_id"], "stopped", exit_code=0, step=7).raise_for_status()

    stopped = job(client, newer)
    assert stopped["status"] == "queued" and stopped["error"] is None
    first = stopped["attempts"][0]
    assert first["ended"] == f"preempted by job {high['id']}, stopped after step 7"
    assert first["stopped_at_step"] == 7 and first["error"] is None
    on_high = started(b, [])
    assert on_high["job_id"] == high["id"]
    entries = client.get("/audit", params={"action": "job.preempt"}).json()["data"]
    assert [(e["actor"], e["target"], e["detail"]["by_job"]) for e in entries] == [
        ("scheduler", f"job {newer}", high["id"])
    ]

    # max_restarts is 0, yet it runs again once the slot is free: from step 7.
    b.finish(on_high["part_id"], "succeeded", exit_code=0).raise_for_status()
    resumed = started(b, [])
    assert resumed["job_id"] == newer and resumed["spec"]["max_restarts"] == 0
    assert (resumed["resume_epoch"], resumed["resume_step"]) == (0, 7)
    assert client.get(f"/jobs/{newer}/model").content == b"state at step 7"
    assert job(client, newer)["attempts"][1]["resumed_from_step"] == 7


def test_a_stop_checkpoint_never_replaces_a_later_one(client: httpx.Client) -> None:
    node = ProtocolNode(client, "n")
    job_id = submit(client, epochs=3)["id"]
    part = started(node)["part_id"]
    assert put_stop_checkpoint(node, part, epoch=2, step=15)
    assert not put_stop_checkpoint(node, part, epoch=2, step=12)  # earlier in the same epoch
    assert not put_stop_checkpoint(node, part, epoch=1, step=9)  # in an earlier epoch
    assert job(client, job_id)["checkpoint"]["step"] == 15
    whole = node.client.put(
        f"/parts/{part}/checkpoint",
        params={"node_id": node.node_id, "epoch": 2},
        content=b"end of epoch 2",
        headers={"content-type": "application/octet-stream", **node.headers},
    )
    assert whole.json()["accepted"]  # the end of epoch 2 comes after a step within it
    assert job(client, job_id)["checkpoint"]["epoch"] == 2
    assert job(client, job_id)["checkpoint"]["step"] is None


def preempt_attempt(client: httpx.Client, **low_spec: Any) -> tuple[dict[str, Any], int]:
    """A low-priority job on the only node, then a priority-5 job: what the
    newcomer says, and the low job's part."""
    node = ProtocolNode(client, "only")
    submit(client, **low_spec)
    part = started(node)["part_id"]
    high = submit(client, priority=5)
    return high, part


@pytest.mark.parametrize(
    "settings,low_spec,why",
    [
        ({"preemption": False}, {}, "preemption is off"),
        ({"preemption_min_run_s": 3600}, {}, "the running job is younger than the minimum"),
        ({}, {"preemptible": False}, "the running job says preemptible: false"),
        ({}, {"priority": 5}, "the running job's priority is the same"),
    ],
)
def test_no_job_is_preempted_when_it_may_not_be(
    tmp_path: Path, settings: dict[str, Any], low_spec: dict[str, Any], why: str
) -> None:
    with serve(tmp_path, **settings) as client:
        high, _ = preempt_attempt(client, **low_spec)
        assert high["pending"]["code"] == "waiting_for_slots", why
        assert high["pending"]["preempting"] == []
        running = client.get("/jobs", params={"status": "running"}).json()["data"][0]
        assert running["attempts"][0]["stop"] is None, why


def test_training_code_that_raises_while_stopping_fails_the_job(client: httpx.Client) -> None:
    high, part = preempt_attempt(client)
    node_id = client.get("/nodes").json()["data"][0]["id"]
    low = client.get("/jobs", params={"status": "running"}).json()["data"][0]
    finished = client.post(
        f"/parts/{part}/finish",
        json={"node_id": node_id, "status": "failed", "exit_code": 1, "reason": "rank_failed"},
    )
    finished.raise_for_status()
    failed = job(client, low["id"])
    assert failed["status"] == "failed" and failed["error"]["reason"] == "rank_failed"
    assert job(client, high["id"])["status"] == "running"


def test_a_part_its_node_never_stops_is_stopped_past_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("api.core.stops.NODE_KILL_MARGIN_S", 0.0)
    with serve(tmp_path, stop_grace_s=0.5) as client:
        high, part = preempt_attempt(client)
        node = client.get("/nodes").json()["data"][0]
        # A node of an older release: it never answers the request.
        told = wait_for(
            lambda: client.post(
                f"/nodes/{node['id']}/poll", json={"active_part_ids": [part]}
            ).json()["stop"],
            what="the plain stop",
        )
        assert told == [part]
        client.post(
            f"/parts/{part}/finish", json={"node_id": node["id"], "status": "cancelled"}
        ).raise_for_status()
        low = client.get("/jobs", params={"status": "queued"}).json()["data"]
        assert [j["id"] for j in low] != [] and low[0]["attempts"][0]["stop"] is not None
        first = low[0]["attempts"][0]
        assert datetime.fromisoformat(first["finished_at"]) > datetime.fromisoformat(
            first["stop"]["deadline_at"]
        )
        assert first["ended"] == f"preempted by job {high['id']}"
        assert job(client, high["id"])["status"] == "running"


def test_a_preempted_job_keeps_every_restart_for_failures(client: httpx.Client) -> None:
    node = ProtocolNode(client, "only")
    low = submit(client, max_restarts=1)["id"]
    part = started(node)["part_id"]
    high = submit(client, priority=5)["id"]
    node.finish(part, "stopped", exit_code=0).raise_for_status()
    high_part = started(node, [])["part_id"]
    node.finish(high_part, "succeeded", exit_code=0).raise_for_status()
    again = started(node, [])
    assert again["job_id"] == low
    # A retryable failure now uses the one restart it has: the stop used none.
    node.finish(again["part_id"], "failed", exit_code=-9, reason="rank_exited").raise_for_status()
    retrying = job(client, low)
    assert retrying["status"] == "queued", retrying
    assert retrying["pending_reason"].startswith("restart 1 of 1 after rank_exited")
    assert job(client, high)["status"] == "succeeded"
