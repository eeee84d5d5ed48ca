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

from cli.__main__ import main as cli
from tests.api.conftest import ProtocolNode, ThreadedServer, make_settings, wait_for
from tests.api.test_jobs_api import submit
from tests.api.test_monitoring import scrape
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


def node_view(client: httpx.Client, node_id: int) -> dict[str, Any]:
    nodes = client.get("/nodes").raise_for_status().json()["data"]
    found: dict[str, Any] = next(n for n in nodes if n["id"] == node_id)
    return found


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
    # The numbers behind it are still the slots it waits for.
    assert (high["pending"]["nodes_live"], high["pending"]["nodes_free"]) == (2, 0)
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
    assert scrape(client)[("ddpo_stops_total", (("reason", "preempted"),))] == 1
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


def test_a_drained_node_takes_no_part_and_its_jobs_move_from_their_step(
    client: httpx.Client,
) -> None:
    a, b, c = (ProtocolNode(client, name) for name in ("a", "b", "c"))
    job_id = submit(client, topology={"num_machines": 2, "num_processes": 1})["id"]
    polled = {node.name: node.poll()["start"] for node in (a, b, c)}
    held = {name: starts[0] for name, starts in polled.items() if starts}
    assert len(held) == 2
    for name, assignment in held.items():
        runner = {"a": a, "b": b, "c": c}[name]
        client.post(
            f"/parts/{assignment['part_id']}/started", json={"node_id": runner.node_id}
        ).raise_for_status()
    machine_1 = next(name for name, s in held.items() if s["machine_id"] == 1)
    node = {"a": a, "b": b, "c": c}[machine_1]

    # Its parts run on until the deadline...
    drained = client.post(f"/nodes/{node.node_id}/drain", json={"deadline_s": 3600}).json()
    assert drained["drain"]["reason"] == "drained"
    assert node.poll([held[machine_1]["part_id"]])["checkpoint_and_stop"] == []
    # ... and then stop at a step: now.
    client.post(f"/nodes/{node.node_id}/drain", json={"deadline_s": 0}).raise_for_status()
    for name, assignment in held.items():
        asked = {"a": a, "b": b, "c": c}[name].poll([assignment["part_id"]])
        assert [r["reason"] for r in asked["checkpoint_and_stop"]] == ["drained"]
    for name, assignment in held.items():
        {"a": a, "b": b, "c": c}[name].finish(
            assignment["part_id"], "stopped", exit_code=0, step=12
        ).raise_for_status()
    moved = job(client, job_id)
    assert moved["attempts"][0]["ended"] == f"drained (node {machine_1}), stopped after step 12"
    # Placed again at once, on the two nodes that are not drained.
    again = {n.name: n.poll()["start"] for n in (a, b, c)}
    assert sorted(name for name, s in again.items() if s) == sorted({"a", "b", "c"} - {machine_1})
    assert again[machine_1] == []
    assert node_view(client, node.node_id)["drain"] is not None

    # Another job waits rather than run on the drained node, until undrained.
    single = submit(client)["id"]
    assert job(client, single)["status"] == "queued" and node.poll()["start"] == []
    undrained = client.post(f"/nodes/{node.node_id}/undrain").json()
    assert undrained["drain"] is None
    assert [s["job_id"] for s in node.poll()["start"]] == [single]
    actions = [e["action"] for e in client.get("/audit").json()["data"]]
    assert actions.count("node.drain") == 2 and actions.count("node.undrain") == 1
    metrics = scrape(client)
    assert metrics[("ddpo_stops_total", (("reason", "drained"),))] == 1
    assert metrics[("ddpo_stops_total", (("reason", "preempted"),))] == 0
    assert metrics[("ddpo_nodes_draining", ())] == 0


def test_a_leaving_node_hands_its_parts_back_and_takes_parts_again_once_registered(
    client: httpx.Client,
) -> None:
    node = ProtocolNode(client, "leaves", slots=2)
    job_id = submit(client)["id"]
    part = started(node)["part_id"]
    left = client.post(f"/nodes/{node.node_id}/leave", json={"grace_s": 20}, headers=node.headers)
    assert left.status_code == 200, left.text
    asked = node.poll([part])["checkpoint_and_stop"]
    assert [(r["reason"], r["detail"]) for r in asked] == [("node_leaving", "node leaves")]
    assert asked[0]["grace_s"] <= 20
    assert node_view(client, node.node_id)["drain"]["reason"] == "node_leaving"
    node.finish(part, "stopped", exit_code=0, step=3).raise_for_status()
    waiting = job(client, job_id)
    assert waiting["status"] == "queued" and waiting["error"] is None
    assert node.poll()["start"] == []  # it is leaving: nothing new
    # Its worker is back (the same credential): it takes parts again.
    back = client.post(
        "/nodes/register", json={"name": "leaves", "address": "127.0.0.1"}, headers=node.headers
    )
    assert back.status_code == 200, back.text
    assert [s["job_id"] for s in node.poll()["start"]] == [job_id]


def test_a_bad_drain_is_refused_naming_what_is_wrong(client: httpx.Client) -> None:
    node = ProtocolNode(client, "n")
    for body in ({"deadline_s": -1}, {"deadline_s": "soon"}, {"deadline_s": 10**9}):
        refused = client.post(f"/nodes/{node.node_id}/drain", json=body)
        assert refused.status_code == 422 and "deadline_s" in refused.text, refused.text
    assert client.post("/nodes/999/drain", json={}).status_code == 404
    client.post(f"/nodes/{node.node_id}/revoke").raise_for_status()
    revoked = client.post(f"/nodes/{node.node_id}/drain", json={})
    assert revoked.status_code == 409 and "revoked" in revoked.json()["detail"]
    assert node_view(client, node.node_id)["drain"] is None


def test_the_cli_drains_and_undrains_a_node_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serve(tmp_path) as client:
        node = ProtocolNode(client, "gpu-7")
        submit(client)
        part = started(node)["part_id"]
        url = str(client.base_url)
        assert cli(["drain", "--server", url, "gpu-7", "--deadline", "600"]) == 0
        assert "node 1 (gpu-7): draining" in capsys.readouterr().out
        assert cli(["nodes", "--server", url]) == 0
        assert "draining" in capsys.readouterr().out
        node.finish(part, "succeeded", exit_code=0).raise_for_status()
        assert cli(["nodes", "--server", url]) == 0
        assert "drained" in capsys.readouterr().out
        assert cli(["undrain", "--server", url, "1"]) == 0
        assert "node 1 (gpu-7): live" in capsys.readouterr().out
        assert cli(["drain", "--server", url, "no-such-node"]) == 1
        assert "no node named 'no-such-node'" in capsys.readouterr().err
        assert cli(["drain", "--server", url, "gpu-7", "--deadline", "-5"]) == 1
        assert "deadline_s" in capsys.readouterr().err
