"""Retries, fencing, deadlines and idempotent submission, driven over HTTP by
hand-played nodes so each failure can be staged exactly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import ProtocolNode, ThreadedServer, make_settings, wait_for
from tests.api.test_protocol import job, submit


@pytest.fixture
def quick(tmp_path: Path) -> Iterator[httpx.Client]:
    """A server whose retries wait a moment only."""
    settings = make_settings(
        tmp_path,
        poll_wait_s=0.5,
        sweep_interval_s=0.1,
        retry_backoff_s=0.2,
        retry_backoff_max_s=0.2,
        artifacts_dir=tmp_path / "artifacts",
    )
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


def started(node: ProtocolNode, active: list[int] | None = None) -> dict[str, Any]:
    """The one assignment the node's next polls hand out (waiting out a backoff)."""
    starts = wait_for(lambda: node.poll(active)["start"], what="an assignment")
    assert len(starts) == 1
    assignment: dict[str, Any] = starts[0]
    node.client.post(
        f"/parts/{assignment['part_id']}/started", json={"node_id": node.node_id}
    ).raise_for_status()
    return assignment


def put_checkpoint(node: ProtocolNode, part_id: int, epoch: int, body: bytes) -> httpx.Response:
    return node.client.put(
        f"/parts/{part_id}/checkpoint",
        params={"node_id": node.node_id, "epoch": epoch},
        content=body,
        headers={"content-type": "application/octet-stream", **node.headers},
    )


def upload_checkpoint(node: ProtocolNode, part_id: int, epoch: int, body: bytes) -> bool:
    accepted: bool = (
        put_checkpoint(node, part_id, epoch, body).raise_for_status().json()["accepted"]
    )
    return accepted


def progress(node: ProtocolNode, part_id: int, seq: int, epoch: int) -> bool:
    report = {
        "seq": seq,
        "epoch": epoch,
        "batch": 10,
        "batches_per_epoch": 100,
        "loss": 0.5,
        "at": "2026-11-30T12:00:00Z",
    }
    response = node.client.post(
        f"/parts/{part_id}/progress", json={"node_id": node.node_id, "reports": [report]}
    )
    accepted: bool = response.raise_for_status().json()["accepted"]
    return accepted


def test_a_killed_rank_is_retried_from_the_last_checkpoint(quick: httpx.Client) -> None:
    node = ProtocolNode(quick, "a")
    job_id = submit(quick, epochs=3, max_restarts=1)
    first = started(node)
    assert first["resume_epoch"] is None
    assert upload_checkpoint(node, first["part_id"], 1, b"epoch one")
    node.finish(
        first["part_id"], "failed", exit_code=-9, reason="rank_exited", message="rank 0 killed"
    ).raise_for_status()

    view = job(quick, job_id)
    assert view["status"] == "queued"
    assert view["pending_reason"].startswith("restart 1 of 1 after rank_exited")
    assert "checkpoint of epoch 1" in view["pending_reason"]
    assert view["error"] is None
    assert view["attempts"][0]["error"]["reason"] == "rank_exited"

    second = started(node)
    assert second["attempt_id"] != first["attempt_id"]
    assert second["resume_epoch"] == 1
    assert quick.get(f"/jobs/{job_id}/model").content == b"epoch one"
    # The old attempt is fenced off: nothing it sends lands in the new one.
    assert not progress(node, first["part_id"], seq=99, epoch=2)
    assert not upload_checkpoint(node, first["part_id"], 2, b"stale")
    assert progress(node, second["part_id"], seq=1, epoch=2)

    node.finish(second["part_id"], "succeeded", exit_code=0).raise_for_status()
    view = job(quick, job_id)
    assert view["status"] == "succeeded" and view["attempt"] == 2
    assert [a["resumed_from_epoch"] for a in view["attempts"]] == [None, 1]
    assert view["progress"]["epoch"] == 2


def test_a_retry_waits_for_the_old_ranks_to_stop(quick: httpx.Client) -> None:
    """Machine 1 failed; machine 0's ranks still run on node a, so the new
    attempt cannot be placed beside them until a confirms they stopped."""
    a, b = ProtocolNode(quick, "a"), ProtocolNode(quick, "b")
    job_id = submit(quick, machines=2, max_restarts=1)
    parts = {n.name: started(n)["part_id"] for n in (a, b)}
    b.finish(parts["b"], "failed", reason="node_lost", message="gone").raise_for_status()
    assert job(quick, job_id)["status"] == "queued"
    # a is told to stop, and gets nothing new while its old part holds the slot.
    assert a.poll([parts["a"]])["stop"] == [parts["a"]]
    assert a.poll([parts["a"]])["start"] == []
    a.finish(parts["a"], "cancelled").raise_for_status()
    news = [started(n)["machine_id"] for n in (a, b)]
    assert sorted(news) == [0, 1]
    assert job(quick, job_id)["attempt"] == 2


@pytest.mark.parametrize(
    "reason,exit_code",
    [("rank_failed", 1), ("rank_exited", 2)],
    ids=["the code raised", "the code exited non-zero"],
)
def test_a_failure_of_the_training_code_is_never_retried(
    quick: httpx.Client, reason: str, exit_code: int
) -> None:
    node = ProtocolNode(quick, "a")
    job_id = submit(quick, max_restarts=3)
    part = started(node)["part_id"]
    node.finish(part, "failed", exit_code=exit_code, reason=reason).raise_for_status()
    view = job(quick, job_id)
    assert view["status"] == "failed" and view["error"]["reason"] == reason
    assert node.poll()["start"] == []
    assert len(view["attempts"]) == 1


def test_restarts_run_out(quick: httpx.Client) -> None:
    node = ProtocolNode(quick, "a")
    job_id = submit(quick, max_restarts=2)
    for _ in range(3):
        part = started(node)["part_id"]
        node.finish(part, "failed", reason="launcher_died", exit_code=-9).raise_for_status()
    view = job(quick, job_id)
    assert view["status"] == "failed" and view["error"]["reason"] == "launcher_died"
    assert len(view["attempts"]) == 3
    assert node.poll()["start"] == []


def test_a_peer_report_does_not_retry_a_crash_in_the_code(quick: httpx.Client) -> None:
    """The peer's "lost its connection" often arrives first and looks
    retryable; the root cause that follows decides."""
    a, b = ProtocolNode(quick, "a"), ProtocolNode(quick, "b")
    job_id = submit(quick, machines=2, max_restarts=1)
    parts = {n.name: started(n)["part_id"] for n in (a, b)}
    a.finish(parts["a"], "failed", reason="peer_failure", exit_code=1).raise_for_status()
    assert job(quick, job_id)["status"] == "queued"
    b.finish(
        parts["b"], "failed", reason="rank_failed", exit_code=1, failing_rank=1
    ).raise_for_status()
    view = job(quick, job_id)
    assert view["status"] == "failed"
    assert (view["error"]["reason"], view["error"]["rank"]) == ("rank_failed", 1)
    assert view["attempts"][0]["error"]["reason"] == "rank_failed"


def test_a_deadline_fails_the_job_and_stops_its_ranks(quick: httpx.Client) -> None:
    node = ProtocolNode(quick, "a")
    job_id = submit(quick, max_run_seconds=0.5, max_restarts=3)
    part = started(node)["part_id"]
    view = wait_for(
        lambda: (v := job(quick, job_id))["status"] == "failed" and v, what="the deadline"
    )
    assert view["error"]["reason"] == "deadline"
    assert "max_run_seconds=0.5" in view["error"]["message"]
    assert node.poll([part])["stop"] == [part]
    node.finish(part, "cancelled").raise_for_status()
    view = job(quick, job_id)
    assert view["status"] == "failed" and len(view["attempts"]) == 1  # not retried


def test_the_same_idempotency_key_returns_the_same_job(quick: httpx.Client) -> None:
    body = {"epochs": 2, "name": "nightly"}
    headers = {"Idempotency-Key": "nightly-2026-11-30"}
    first = quick.post("/jobs", json=body, headers=headers)
    again = quick.post("/jobs", json=body, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert quick.get("/jobs").json()["count"] == 1

    other = quick.post("/jobs", json={"epochs": 3}, headers=headers)
    assert other.status_code == 409 and "different spec" in other.json()["detail"]
    assert quick.post("/jobs", json=body).status_code == 201  # no key: a new job
    assert quick.get("/jobs").json()["count"] == 2


def send_logs(node: ProtocolNode, part_id: int, *ranks: int | None) -> httpx.Response:
    lines = [
        {"rank": rank, "offset": 100 * i, "text": f"late {rank}", "at": "2026-12-01T00:00:00Z"}
        for i, rank in enumerate(ranks)
    ]
    return node.client.post(
        f"/parts/{part_id}/logs", json={"node_id": node.node_id, "lines": lines}
    )


def test_once_a_job_has_ended_its_nodes_change_neither_its_model_nor_its_logs(
    quick: httpx.Client,
) -> None:
    node = ProtocolNode(quick, "a")
    job_id = submit(quick, epochs=2)
    part_id = started(node)["part_id"]
    assert upload_checkpoint(node, part_id, 2, b"the final model")
    assert send_logs(node, part_id, 0, None).json() == {"accepted": True}
    node.finish(part_id, "succeeded", exit_code=0).raise_for_status()
    assert job(quick, job_id)["status"] == "succeeded"

    assert not upload_checkpoint(node, part_id, 2, b"something else")
    assert quick.get(f"/jobs/{job_id}/model").content == b"the final model"
    assert job(quick, job_id)["checkpoint"]["epoch"] == 2
    assert send_logs(node, part_id, 0).json() == {"accepted": False}
    texts = [line["text"] for line in quick.get(f"/jobs/{job_id}/logs").json()["lines"]]
    assert texts == ["late 0", "late None"]


def test_an_epoch_or_a_rank_the_job_does_not_have_is_refused(quick: httpx.Client) -> None:
    node = ProtocolNode(quick, "a")
    job_id = submit(quick, epochs=2, processes=2)
    part_id = started(node)["part_id"]
    beyond = node.client.put(
        f"/parts/{part_id}/checkpoint",
        params={"node_id": node.node_id, "epoch": 3},
        content=b"epoch three of two",
        headers={"content-type": "application/octet-stream"},
    )
    assert beyond.status_code == 409
    assert beyond.json()["detail"] == f"epoch: job {job_id} has 2 epoch(s), not 3"
    stray = send_logs(node, part_id, 1, 2, 7)
    assert stray.status_code == 409
    assert stray.json()["detail"] == (
        f"lines.rank: machine 0 of job {job_id} has ranks 0-1, not 2, 7"
    )
    assert quick.get(f"/jobs/{job_id}/logs").json()["lines"] == []  # none of the batch kept
    assert job(quick, job_id)["checkpoint"] is None


def test_a_retry_starts_when_its_backoff_ends_though_nothing_else_happens(
    tmp_path: Path,
) -> None:
    """The tick skips planning while nothing placement reads has changed;
    a backoff ending is a change too, with the database quiet."""
    settings = make_settings(tmp_path, poll_wait_s=0.5, sweep_interval_s=0.1, retry_backoff_s=1.0)
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url, timeout=10) as c:
        node = ProtocolNode(c, "a")
        job_id = submit(c, max_restarts=1)
        first = started(node)
        node.finish(
            first["part_id"], "failed", exit_code=-9, reason="rank_exited", message="killed"
        )
        assert job(c, job_id)["status"] == "queued"
        # Reads only, from here: nothing writes while the backoff runs out.
        view = wait_for(
            lambda: (v := job(c, job_id))["status"] == "running" and v, what="the retry placed"
        )
        assert view["attempt"] == 2
