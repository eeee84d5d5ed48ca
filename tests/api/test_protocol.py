"""Scheduling and the worker protocol, driven over HTTP by hand-played nodes
so every state can be reached exactly."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.settings import ServerSettings
from tests.api.conftest import ProtocolNode, ThreadedServer, make_settings, wait_for


def submit(client: httpx.Client, machines: int = 1, processes: int = 1, **spec: Any) -> int:
    body = {"topology": {"num_machines": machines, "num_processes": processes}, **spec}
    job_id: int = client.post("/jobs", json=body).raise_for_status().json()["id"]
    return job_id


def job(client: httpx.Client, job_id: int) -> dict[str, Any]:
    result: dict[str, Any] = client.get(f"/jobs/{job_id}").raise_for_status().json()
    return result


def test_a_gang_starts_only_when_all_its_machines_can(client: httpx.Client) -> None:
    a = ProtocolNode(client, "a")
    job_id = submit(client, machines=2)
    assert a.poll()["start"] == []
    assert job(client, job_id)["status"] == "queued"
    assert "1 of 1 live node(s) qualify" in job(client, job_id)["pending_reason"]

    b = ProtocolNode(client, "b")
    starts = a.poll()["start"] + b.poll()["start"]
    assert sorted(s["machine_id"] for s in starts) == [0, 1]
    assert {s["job_id"] for s in starts} == {job_id}
    assert len({s["part_id"] for s in starts}) == 2

    view = job(client, job_id)
    assert view["status"] == "running" and view["attempt"] == 1
    assert sorted(p["node_name"] for p in view["parts"]) == ["a", "b"]
    machine0 = next(s for s in starts if s["machine_id"] == 0)
    assert view["master_addr"] == machine0["master_addr"] == "127.0.0.1"
    assert all(s["master_port"] == view["master_port"] for s in starts)


def test_machine_0_publishes_the_rendezvous_port_to_the_others(client: httpx.Client) -> None:
    a, b = ProtocolNode(client, "a"), ProtocolNode(client, "b")
    job_id = submit(client, machines=2)
    starts = {n.name: n.poll()["start"][0] for n in (a, b)}
    first = next(n for n in (a, b) if starts[n.name]["machine_id"] == 0)
    second = b if first is a else a
    part0, part1 = starts[first.name]["part_id"], starts[second.name]["part_id"]
    # Nobody knows the port until machine 0's launcher has bound it.
    assert starts[second.name]["master_port"] is None
    assert second.poll([part1], waiting_for_port=[part1])["rendezvous"] == []

    def bind(node: ProtocolNode, part_id: int, port: int) -> httpx.Response:
        return client.post(
            f"/parts/{part_id}/rendezvous", json={"node_id": node.node_id, "master_port": port}
        )

    assert bind(second, part1, 40000).status_code == 409  # only machine 0 hosts it
    assert bind(first, part0, 40001).json() == {"accepted": True}
    assert bind(first, part0, 40001).json() == {"accepted": True}  # a resend is harmless
    assert bind(first, part0, 40002).status_code == 409  # but it cannot move
    assert second.poll([part1], waiting_for_port=[part1])["rendezvous"] == [
        {"part_id": part1, "master_port": 40001}
    ]
    assert second.poll([part1])["rendezvous"] == []  # once known, not repeated
    view = job(client, job_id)
    assert (view["master_addr"], view["master_port"]) == ("127.0.0.1", 40001)


def test_nccl_without_gpus_stays_queued_with_a_reason(client: httpx.Client) -> None:
    cpu = ProtocolNode(client, "cpu")
    job_id = submit(client, machines=1, processes=2, backend="nccl")
    assert cpu.poll()["start"] == []
    view = job(client, job_id)
    assert view["status"] == "queued" and "2 GPU(s) for nccl" in view["pending_reason"]

    gpu = ProtocolNode(client, "gpu", gpus=2)
    assert [s["job_id"] for s in gpu.poll()["start"]] == [job_id]


def heartbeat(client: httpx.Client, name: str) -> datetime:
    """When the node last polled."""
    node = next(n for n in client.get("/nodes").json()["data"] if n["name"] == name)
    return datetime.fromisoformat(node["last_heartbeat_at"])


# Polls may be held 30 s; the tests give them 10 s to answer, so only a poll
# woken by the news (not one that ran out its wait) passes.
LONG_POLL = {"poll_wait_s": 30.0, "heartbeat_timeout_s": 60.0}


def test_a_long_poll_is_woken_by_a_new_job(tmp_path: Path) -> None:
    with (
        ThreadedServer(make_settings(tmp_path, **LONG_POLL)) as server,
        httpx.Client(base_url=server.url, timeout=60) as client,
    ):
        node = ProtocolNode(client, "a")
        answers: list[dict[str, Any]] = []
        poller = threading.Thread(target=lambda: answers.append(node.poll(wait_s=30.0)))
        polling_since = heartbeat(client, "a")
        poller.start()
        wait_for(lambda: heartbeat(client, "a") > polling_since, what="the poll to be waiting")
        job_id = submit(client)
        poller.join(10)
        assert not poller.is_alive(), "the poll was not woken by the new job"
        assert [s["job_id"] for s in answers[0]["start"]] == [job_id]


def held_poll(
    client: httpx.Client, node: ProtocolNode, **poll: Any
) -> tuple[threading.Thread, list[dict[str, Any]]]:
    """A poll held open (30 s), running by the time this returns."""
    answers: list[dict[str, Any]] = []
    poller = threading.Thread(target=lambda: answers.append(node.poll(wait_s=30.0, **poll)))
    polling_since = heartbeat(client, node.name)
    poller.start()
    wait_for(lambda: heartbeat(client, node.name) > polling_since, what="the poll to be waiting")
    return poller, answers


def test_a_long_poll_is_woken_by_its_rendezvous_port_and_by_a_cancel(tmp_path: Path) -> None:
    with (
        ThreadedServer(make_settings(tmp_path, **LONG_POLL)) as server,
        httpx.Client(base_url=server.url, timeout=60) as client,
    ):
        a, b = ProtocolNode(client, "a"), ProtocolNode(client, "b")
        job_id = submit(client, machines=2)
        parts = {n.name: n.poll()["start"][0] for n in (a, b)}
        first, other = sorted(parts.values(), key=lambda p: p["machine_id"])
        zero, one = (a, b) if parts["a"] is first else (b, a)
        # Machine 1 waits for the port; machine 0's launcher binds it.
        poller, answers = held_poll(
            client, one, active=[other["part_id"]], waiting_for_port=[other["part_id"]]
        )
        client.post(
            f"/parts/{first['part_id']}/rendezvous",
            json={"node_id": zero.node_id, "master_port": 29512},
            headers=zero.headers,
        ).raise_for_status()
        poller.join(10)
        assert not poller.is_alive(), "the poll was not woken by the rendezvous port"
        assert answers[0]["rendezvous"] == [{"part_id": other["part_id"], "master_port": 29512}]

        poller, answers = held_poll(client, zero, active=[first["part_id"]])
        client.post(f"/jobs/{job_id}/cancel").raise_for_status()
        poller.join(10)
        assert not poller.is_alive(), "the poll was not woken by the cancel"
        assert answers[0]["stop"] == [first["part_id"]]


def test_cancel_stops_every_part_then_ends_cancelled(client: httpx.Client) -> None:
    a, b = ProtocolNode(client, "a"), ProtocolNode(client, "b")
    job_id = submit(client, machines=2)
    parts = {n.name: n.poll()["start"][0]["part_id"] for n in (a, b)}

    assert client.post(f"/jobs/{job_id}/cancel").json()["status"] == "cancelling"
    assert a.poll([parts["a"]])["stop"] == [parts["a"]]
    assert b.poll([parts["b"]])["stop"] == [parts["b"]]

    a.finish(parts["a"], "cancelled").raise_for_status()
    assert job(client, job_id)["status"] == "cancelling"  # b's ranks may still run
    b.finish(parts["b"], "cancelled").raise_for_status()
    view = job(client, job_id)
    assert view["status"] == "cancelled"
    assert {p["status"] for p in view["parts"]} == {"cancelled"}


def test_a_failed_part_fails_the_job_and_stops_the_others(client: httpx.Client) -> None:
    a, b = ProtocolNode(client, "a"), ProtocolNode(client, "b")
    job_id = submit(client, machines=2)
    parts = {n.name: n.poll()["start"][0] for n in (a, b)}
    part_b = parts["b"]["part_id"]
    failing_rank = parts["b"]["machine_id"]

    b.finish(
        part_b,
        "failed",
        exit_code=1,
        failing_rank=failing_rank,
        reason="rank_failed",
        message=f"rank {failing_rank} raised",
        traceback_tail="ValueError: boom",
    ).raise_for_status()
    view = job(client, job_id)
    assert view["status"] == "failed"
    assert view["error"]["rank"] == failing_rank and view["error"]["node"] == "b"
    assert view["error"]["traceback_tail"] == "ValueError: boom"
    assert a.poll([parts["a"]["part_id"]])["stop"] == [parts["a"]["part_id"]]
    # The node is free for the next job once its part has stopped.
    a.finish(parts["a"]["part_id"], "cancelled").raise_for_status()
    next_job = submit(client)
    assert [s["job_id"] for s in a.poll()["start"]] == [next_job]


def test_the_root_cause_wins_over_a_peer_that_lost_its_connection(client: httpx.Client) -> None:
    a, b = ProtocolNode(client, "a"), ProtocolNode(client, "b")
    job_id = submit(client, machines=2)
    parts = {n.name: n.poll()["start"][0]["part_id"] for n in (a, b)}
    a.finish(
        parts["a"],
        "failed",
        exit_code=1,
        failing_rank=0,
        reason="peer_failure",
        message="rank 0 lost a peer",
    ).raise_for_status()
    b.finish(
        parts["b"],
        "failed",
        exit_code=1,
        failing_rank=1,
        reason="rank_failed",
        message="rank 1 raised",
        traceback_tail="KeyError",
    ).raise_for_status()
    error = job(client, job_id)["error"]
    assert (error["reason"], error["rank"]) == ("rank_failed", 1)


@pytest.mark.parametrize("then", ["raised", "cancelled"])
def test_a_job_that_heard_only_a_symptom_ends_once_its_other_parts_have_reported(
    client: httpx.Client, then: str
) -> None:
    """A peer's "lost its connection" arrives first: the job is not over
    (a client reading a failed job reads its last word) until the part
    being stopped has said how it ended, and names the cause if it can."""
    a, b = ProtocolNode(client, "a"), ProtocolNode(client, "b")
    job_id = submit(client, machines=2)
    parts = {n.name: n.poll()["start"][0]["part_id"] for n in (a, b)}
    a.finish(
        parts["a"], "failed", exit_code=1, failing_rank=0, reason="peer_failure"
    ).raise_for_status()
    view = job(client, job_id)
    assert view["status"] == "running", view
    assert [p["status"] for p in view["parts"]] == ["failed", "stopping"]
    assert b.poll([parts["b"]])["stop"] == [parts["b"]]
    if then == "raised":
        b.finish(
            parts["b"], "failed", exit_code=1, failing_rank=1, reason="rank_failed"
        ).raise_for_status()
    else:
        b.finish(parts["b"], "cancelled").raise_for_status()
    view = job(client, job_id)
    assert view["status"] == "failed"
    expected = ("rank_failed", 1) if then == "raised" else ("peer_failure", 0)
    assert (view["error"]["reason"], view["error"]["rank"]) == expected
    (attempt,) = view["attempts"]
    assert attempt["finished_at"] is not None
    assert (attempt["error"]["reason"], attempt["error"]["rank"]) == expected


def test_progress_is_kept_once_and_shown_on_the_job(client: httpx.Client) -> None:
    a = ProtocolNode(client, "a")
    job_id = submit(client, epochs=2)
    part_id = a.poll()["start"][0]["part_id"]
    client.post(f"/parts/{part_id}/started", json={"node_id": a.node_id}).raise_for_status()

    def report(seq: int, epoch: int, batch: int, loss: float) -> dict[str, Any]:
        return {
            "seq": seq,
            "epoch": epoch,
            "batch": batch,
            "batches_per_epoch": 10,
            "loss": loss,
            "samples_per_sec": 500.0,
            "at": "2026-01-01T00:00:00Z",
        }

    first = [report(0, 1, 1, 2.3), report(1, 1, 10, 1.5)]
    for _ in range(2):  # a resend after a lost answer changes nothing
        client.post(
            f"/parts/{part_id}/progress", json={"node_id": a.node_id, "reports": first}
        ).raise_for_status()
    client.post(
        f"/parts/{part_id}/progress", json={"node_id": a.node_id, "reports": [report(2, 2, 5, 0.9)]}
    ).raise_for_status()

    progress = job(client, job_id)["progress"]
    assert (progress["epoch"], progress["batch"], progress["percent"]) == (2, 5, 75.0)
    assert progress["loss"] == 0.9
    points = client.get(f"/jobs/{job_id}/metrics").json()["points"]
    assert [(p["step"], p["loss"]) for p in points] == [(1, 2.3), (10, 1.5), (15, 0.9)]


def test_a_running_jobs_lines_read_between_batches_show_each_new_one(
    client: httpx.Client,
) -> None:
    """What ``ddpo logs --follow`` and the dashboard do: read, a batch
    arrives, read again. A read is answered from the cache until a write
    changes its tables or a second passes (api/read_cache.py): lines
    written without ORM objects were once not counted, and the second read
    gave the first's."""
    node = ProtocolNode(client, "chatty")
    job_id = submit(client)
    part_id = node.poll()["start"][0]["part_id"]
    at = "2026-01-01T00:00:00Z"
    seen: list[str] = []
    for batch in range(3):
        body = [
            {"rank": 0, "offset": 100 * batch + i, "text": f"{batch}.{i}", "at": at}
            for i in range(2)
        ]
        sent = client.post(f"/parts/{part_id}/logs", json={"node_id": node.node_id, "lines": body})
        assert sent.json() == {"accepted": True}
        seen += [f"{batch}.0", f"{batch}.1"]
        lines = client.get(f"/jobs/{job_id}/logs").json()["lines"]
        assert [line["text"] for line in lines] == seen
        tail = client.get(f"/jobs/{job_id}/logs", params={"tail": 1}).json()["lines"]
        assert [line["text"] for line in tail] == [seen[-1]]


def test_log_lines_come_back_exactly_as_sent_whatever_they_hold(client: httpx.Client) -> None:
    """On PostgreSQL the lines go in by COPY (db/queries.py, insert_logs),
    whose text format gives tabs, backslashes and ``\\.`` meanings of its own."""
    node = ProtocolNode(client, "odd")
    job_id = submit(client)
    part_id = node.poll()["start"][0]["part_id"]
    texts = ["tab\there", "back\\slash \\N", "cr\rx", "\\.", "quote\"'", "ünï©ødé ✓", "", "a,b;c|d"]
    body = [
        {"rank": 0, "offset": i, "text": text, "at": "2026-01-01T00:00:00Z"}
        for i, text in enumerate(texts)
    ]
    sent = client.post(f"/parts/{part_id}/logs", json={"node_id": node.node_id, "lines": body})
    assert sent.json() == {"accepted": True}
    lines = client.get(f"/jobs/{job_id}/logs").json()["lines"]
    assert [line["text"] for line in lines] == texts


def test_log_lines_are_kept_once_and_served_by_rank_tail_and_since(
    client: httpx.Client,
) -> None:
    a, b = ProtocolNode(client, "a"), ProtocolNode(client, "b")
    job_id = submit(client, machines=2, processes=2)
    starts = {n.name: n.poll()["start"][0] for n in (a, b)}
    at = "2026-01-01T00:00:00Z"

    def send(
        node: ProtocolNode, lines: list[tuple[int | None, int, str]], at: str = at
    ) -> httpx.Response:
        part_id = starts[node.name]["part_id"]
        body = [{"rank": r, "offset": o, "text": t, "at": at} for r, o, t in lines]
        return client.post(f"/parts/{part_id}/logs", json={"node_id": node.node_id, "lines": body})

    machine = {n.name: starts[n.name]["machine_id"] for n in (a, b)}
    m0 = a if machine["a"] == 0 else b
    m1 = b if m0 is a else a
    first = [(0, 0, "rank 0 says hello"), (1, 0, "rank 1 says hello"), (None, 0, "launcher")]
    for _ in range(2):  # a resend after a lost answer changes nothing
        assert send(m0, first).json() == {"accepted": True}
    send(m0, [(0, 18, "rank 0 again")]).raise_for_status()
    # A node's clock in another zone: the line's time is kept as the same instant.
    send(m1, [(2, 0, "rank 2 on machine 1")], at="2026-01-01T02:30:00+02:00").raise_for_status()

    def logs(**params: Any) -> dict[str, Any]:
        page: dict[str, Any] = (
            client.get(f"/jobs/{job_id}/logs", params=params).raise_for_status().json()
        )
        return page

    every = logs()
    assert [(line["machine_id"], line["rank"], line["text"]) for line in every["lines"]] == [
        (0, 0, "rank 0 says hello"),
        (0, 1, "rank 1 says hello"),
        (0, None, "launcher"),
        (0, 0, "rank 0 again"),
        (1, 2, "rank 2 on machine 1"),
    ]
    assert every["job_status"] == "running"
    times = [datetime.fromisoformat(line["at"].replace("Z", "+00:00")) for line in every["lines"]]
    assert [t.isoformat() for t in times] == ["2026-01-01T00:00:00+00:00"] * 4 + [
        "2026-01-01T00:30:00+00:00"
    ]
    assert [x["text"] for x in logs(rank=0)["lines"]] == ["rank 0 says hello", "rank 0 again"]
    assert [x["text"] for x in logs(machine_id=1)["lines"]] == ["rank 2 on machine 1"]
    assert [x["text"] for x in logs(tail=2)["lines"]] == ["rank 0 again", "rank 2 on machine 1"]
    cursor = logs(limit=2)["next_since"]
    assert next(x["text"] for x in logs(since=cursor)["lines"]) == "launcher"
    assert logs(since=every["next_since"]) == {
        "lines": [],
        "next_since": every["next_since"],
        "job_status": "running",
    }

    # Nobody else's part; nonsense is named.
    assert send(m1, []).status_code == 200
    part0 = starts[m0.name]["part_id"]
    assert (
        client.post(f"/parts/{part0}/logs", json={"node_id": m1.node_id, "lines": []}).status_code
        == 403
    )
    bad = client.get(f"/jobs/{job_id}/logs", params={"tail": 0})
    assert bad.status_code == 422 and bad.json()["detail"][0]["msg"].startswith("tail:")
    assert client.get("/jobs/999999/logs").status_code == 404


def test_a_node_cannot_report_for_another_nodes_part(client: httpx.Client) -> None:
    a, b = ProtocolNode(client, "a"), ProtocolNode(client, "b")
    job_id = submit(client)
    owner_name = job(client, job_id)["parts"][0]["node_name"]
    owner, other = (a, b) if owner_name == "a" else (b, a)
    part_id = owner.poll()["start"][0]["part_id"]
    attempts: list[tuple[str, dict[str, object]]] = [
        ("finish", {"status": "succeeded"}),
        ("started", {}),
        ("progress", {"reports": []}),
    ]
    for path, body in attempts:
        response = client.post(f"/parts/{part_id}/{path}", json={"node_id": other.node_id, **body})
        assert response.status_code == 403
        assert (
            response.json()["detail"] == f"part {part_id} is not assigned to node {other.node_id}"
        )
    assert job(client, job_id)["parts"][0]["status"] == "assigned"


def quick_loss_settings(tmp_path: Path) -> ServerSettings:
    """A node silent for a second is lost."""
    return make_settings(tmp_path, heartbeat_timeout_s=1.0, poll_wait_s=0.2, sweep_interval_s=0.1)


def test_a_silent_node_is_lost_and_its_job_fails(tmp_path: Path) -> None:
    settings = quick_loss_settings(tmp_path)
    with (
        ThreadedServer(settings) as server,
        httpx.Client(base_url=server.url, timeout=10) as client,
    ):
        a, b = ProtocolNode(client, "a"), ProtocolNode(client, "b")
        job_id = submit(client, machines=2)
        a_part = a.poll()["start"][0]["part_id"]
        b.poll()

        def b_lost_while_a_polls() -> bool:
            a.poll([a_part])
            return bool(job(client, job_id)["status"] == "failed")

        wait_for(b_lost_while_a_polls, timeout_s=10, what="node b to be lost")
        view = job(client, job_id)
        assert view["error"]["reason"] == "node_lost" and view["error"]["node"] == "b"
        nodes = {n["name"]: n["state"] for n in client.get("/nodes").json()["data"]}
        assert nodes == {"a": "live", "b": "lost"}
        assert a.poll([a_part])["stop"] == [a_part]
        # It comes back: live again, and the lost part is not handed back.
        assert b.poll()["start"] == []
        assert {n["name"]: n["state"] for n in client.get("/nodes").json()["data"]}["b"] == "live"


def test_a_restarted_worker_loses_what_it_ran(client: httpx.Client) -> None:
    a = ProtocolNode(client, "a")
    job_id = submit(client)
    a.poll()
    ProtocolNode(client, "a")  # same name registers again: its processes are gone
    view = job(client, job_id)
    assert view["status"] == "failed" and view["error"]["reason"] == "worker_restarted"
    assert view["parts"][0]["status"] == "lost"


def test_a_lost_node_explains_a_failure_its_peers_only_felt(tmp_path: Path) -> None:
    """The survivor's 'connection closed by peer' arrives first; once the
    silent node is declared lost, that becomes the job's error."""
    settings = quick_loss_settings(tmp_path)
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url) as client:
        a, b = ProtocolNode(client, "a"), ProtocolNode(client, "b")
        job_id = submit(client, machines=2)
        a_part = a.poll()["start"][0]["part_id"]
        b.poll()
        a.finish(a_part, "failed", reason="peer_failure", message="rank 0 lost a peer")
        assert job(client, job_id)["error"]["reason"] == "peer_failure"

        def explained() -> bool:
            a.poll()
            return bool(job(client, job_id)["error"]["reason"] == "node_lost")

        wait_for(explained, timeout_s=10, what="node b to be declared lost")
        assert job(client, job_id)["error"]["node"] == "b"


def test_a_waiting_peer_hears_the_port_within_its_poll(tmp_path: Path) -> None:
    with (
        ThreadedServer(make_settings(tmp_path, **LONG_POLL)) as server,
        httpx.Client(base_url=server.url, timeout=60) as client,
    ):
        a, b = ProtocolNode(client, "a"), ProtocolNode(client, "b")
        submit(client, machines=2)
        starts = {n.name: n.poll()["start"][0] for n in (a, b)}
        first, second = (a, b) if starts["a"]["machine_id"] == 0 else (b, a)
        waiting = starts[second.name]["part_id"]
        answers: list[dict[str, Any]] = []
        poller = threading.Thread(
            target=lambda: answers.append(
                second.poll([waiting], wait_s=30.0, waiting_for_port=[waiting])
            )
        )
        polling_since = heartbeat(client, second.name)
        poller.start()
        wait_for(
            lambda: heartbeat(client, second.name) > polling_since, what="the poll to be waiting"
        )
        client.post(
            f"/parts/{starts[first.name]['part_id']}/rendezvous",
            json={"node_id": first.node_id, "master_port": 41000},
        ).raise_for_status()
        poller.join(10)
        assert not poller.is_alive(), "the waiting peer was not woken by the port"
        assert answers[0]["rendezvous"] == [{"part_id": waiting, "master_port": 41000}]


def beat(node: ProtocolNode, active: list[int]) -> list[int]:
    response = node.client.post(
        f"/nodes/{node.node_id}/heartbeat", json={"active_part_ids": active}, headers=node.headers
    )
    stop: list[int] = response.raise_for_status().json()["stop"]
    return stop


def test_heartbeats_alone_keep_a_node_live_and_say_what_to_stop(tmp_path: Path) -> None:
    """A daemon busy for longer than the timeout (a launch, an upload over a
    slow link) sends nothing but heartbeats from its own thread."""
    settings = quick_loss_settings(tmp_path)
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url) as client:
        a = ProtocolNode(client, "a")
        job_id = submit(client)
        part_id = a.poll()["start"][0]["part_id"]
        deadline = time.monotonic() + 3 * settings.heartbeat_timeout_s
        while time.monotonic() < deadline:
            assert beat(a, [part_id]) == []
            time.sleep(settings.heartbeat_timeout_s / 3)
        assert {n["name"]: n["state"] for n in client.get("/nodes").json()["data"]} == {"a": "live"}
        assert job(client, job_id)["status"] == "running"
        # Parts the server settled, and parts it never gave this node, are
        # to be stopped; so are parts of a cancelled job.
        assert beat(a, [part_id, 999]) == [999]
        client.post(f"/jobs/{job_id}/cancel").raise_for_status()
        assert beat(a, [part_id]) == [part_id]


def test_a_lost_parts_late_logs_and_progress_are_refused(tmp_path: Path) -> None:
    settings = quick_loss_settings(tmp_path)
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url) as client:
        a = ProtocolNode(client, "a")
        job_id = submit(client)
        part_id = a.poll()["start"][0]["part_id"]
        wait_for(lambda: job(client, job_id)["status"] == "failed", what="node a to be lost")
        assert job(client, job_id)["parts"][0]["status"] == "lost"
        line = {"rank": 0, "offset": 0, "text": "still here", "at": "2026-12-01T00:00:00Z"}
        logs = client.post(
            f"/parts/{part_id}/logs",
            json={"node_id": a.node_id, "lines": [line]},
            headers=a.headers,
        )
        assert logs.json() == {"accepted": False}
        assert client.get(f"/jobs/{job_id}/logs").json()["lines"] == []
        report = {
            "seq": 0, "epoch": 1, "batch": 10, "batches_per_epoch": 20,
            "loss": 1.0, "samples_per_sec": 1.0, "at": "2026-12-01T00:00:00Z",
        }  # fmt: skip
        progress = client.post(
            f"/parts/{part_id}/progress",
            json={"node_id": a.node_id, "reports": [report]},
            headers=a.headers,
        )
        assert progress.json() == {"accepted": False}
        assert client.get(f"/jobs/{job_id}/metrics").json()["points"] == []
        # Back from the partition, its heartbeat says to stop the part.
        assert beat(a, [part_id]) == [part_id]


def test_a_quiet_nodes_remembered_answer_gives_way_to_news(client: httpx.Client) -> None:
    """A node that heard "nothing" is answered from memory until news for
    it (api/quiet_nodes.py): a part given to it, a cancel."""
    a, b = ProtocolNode(client, "a"), ProtocolNode(client, "b")
    assert a.poll()["start"] == [] and b.poll()["start"] == []  # both quiet now
    job_id = submit(client)
    given = {node.name: node.poll()["start"] for node in (a, b)}
    runner = a if given["a"] else b
    assert [s["job_id"] for s in given[runner.name]] == [job_id]
    part_id = given[runner.name][0]["part_id"]
    assert runner.poll([part_id]) == {
        "start": [],
        "stop": [],
        "checkpoint_and_stop": [],
        "rendezvous": [],
    }
    assert beat(runner, [part_id]) == []  # quiet, running its part
    client.post(f"/jobs/{job_id}/cancel").raise_for_status()
    assert beat(runner, [part_id]) == [part_id]
    assert runner.poll([part_id])["stop"] == [part_id]


def test_a_quiet_node_lost_while_idle_is_live_again_at_its_next_poll(tmp_path: Path) -> None:
    with (
        ThreadedServer(quick_loss_settings(tmp_path)) as server,
        httpx.Client(base_url=server.url, timeout=10) as client,
    ):
        idle = ProtocolNode(client, "idle")
        assert idle.poll()["start"] == []  # quiet: its next answer would come from memory

        def state() -> str:
            nodes = client.get("/nodes").raise_for_status().json()["data"]
            return str(next(n["state"] for n in nodes if n["name"] == "idle"))

        wait_for(lambda: state() == "lost", timeout_s=10, what="the silent node to be lost")
        assert idle.poll()["start"] == []
        assert state() == "live"
