"""Polls, heartbeats and a part's "started" and "finished" answered before
routing (api/node_lane.py): the same answers as the routes give, the same
refusals for what is wrong with a request, and counted in /metrics like
every other request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.core import reports
from api.routes import nodes as node_routes
from api.routes import parts as part_routes
from tests.api.conftest import ProtocolNode, ThreadedServer, bearer, make_settings

JOIN = "join-token-for-the-lane-tests-0123456789"
USER = "user-token-for-the-lane-tests-0123456789"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ThreadedServer, httpx.Client]]:
    settings = make_settings(tmp_path, join_token=JOIN, user_token=USER, poll_wait_s=0.5)
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url, timeout=10) as c:
        yield server, c


@pytest.fixture
def routed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What reached the FastAPI routes (rather than the lane) for nodes."""
    calls: list[str] = []
    poll, heartbeat = node_routes.answer_poll, node_routes.answer_heartbeat

    async def counted_poll(*args: Any) -> Any:
        calls.append("poll")
        return await poll(*args)

    async def counted_heartbeat(*args: Any) -> Any:
        calls.append("heartbeat")
        return await heartbeat(*args)

    monkeypatch.setattr(node_routes, "answer_poll", counted_poll)
    monkeypatch.setattr(node_routes, "answer_heartbeat", counted_heartbeat)
    return calls


@pytest.fixture
def routed_parts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The node ids a part's routes in FastAPI were asked to act for (each
    of them checks that first)."""
    calls: list[int] = []
    checked = part_routes.acting_for

    def counted(own: int | None, node_id: int) -> None:
        calls.append(node_id)
        checked(own, node_id)

    monkeypatch.setattr(part_routes, "acting_for", counted)
    return calls


def placed_part(client: httpx.Client, node: ProtocolNode) -> tuple[int, int]:
    """A one-machine job submitted and handed to ``node``: (job id, part id)."""
    job = client.post("/jobs", json={"epochs": 1}, headers=bearer(USER)).raise_for_status()
    [start] = node.poll(wait_s=0.5)["start"]
    assert start["job_id"] == job.json()["id"]
    return start["job_id"], start["part_id"]


def request_count(client: httpx.Client, route: str, status: int) -> float:
    metrics = client.get("/metrics", headers=bearer(USER)).text
    wanted = f'route="{route}",status="{status}"'
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("ddpo_http_request_duration_seconds_count") and wanted in line
    )


def test_well_formed_polls_and_heartbeats_skip_routing_and_are_answered_as_routes_would(
    served: tuple[ThreadedServer, httpx.Client], routed: list[str]
) -> None:
    _, client = served
    node = ProtocolNode(client, "lane-node", JOIN)
    assert node.poll() == {"start": [], "stop": [], "checkpoint_and_stop": [], "rendezvous": []}
    beat = client.post(
        f"/nodes/{node.node_id}/heartbeat", json={"active_part_ids": [7]}, headers=node.headers
    )
    # Part 7 is not this node's: it must stop it.
    assert beat.status_code == 200 and beat.json() == {"stop": [7], "checkpoint_and_stop": []}
    job = client.post("/jobs", json={"epochs": 1}, headers=bearer(USER)).json()
    answer = node.poll(wait_s=0.5)
    assert [a["job_id"] for a in answer["start"]] == [job["id"]]
    assert answer["start"][0]["spec"]["epochs"] == 1
    assert routed == []  # none of them went through FastAPI's routing


def test_what_is_wrong_with_a_poll_is_said_as_the_routes_say_it(
    served: tuple[ThreadedServer, httpx.Client], routed: list[str]
) -> None:
    _, client = served
    node = ProtocolNode(client, "lane-node", JOIN)
    other = ProtocolNode(client, "other-node", JOIN)
    poll = f"/nodes/{node.node_id}/poll"

    bad_wait = client.post(poll, json={"wait_s": "soon"}, headers=node.headers)
    assert bad_wait.status_code == 422 and "wait_s" in bad_wait.json()["detail"][0]["msg"]
    unknown_field = client.post(poll, json={"wait": 1}, headers=node.headers)
    assert unknown_field.status_code == 422 and "wait" in unknown_field.text
    not_json = client.post(
        poll, content=b"{", headers={**node.headers, "content-type": "application/json"}
    )
    assert not_json.status_code == 422 and "not valid JSON" in not_json.text
    as_text = client.post(
        poll, content=b"{}", headers={**node.headers, "content-type": "text/plain"}
    )
    assert as_text.status_code == 422 and "content-type: application/json" in as_text.text
    query = client.post(f"{poll}?wait_s=1", json={}, headers=node.headers)
    assert query.status_code == 422 and "wait_s" in query.text
    someone_else = client.post(poll, json={}, headers=other.headers)
    assert someone_else.status_code == 403 and f"node {other.node_id}'s" in someone_else.text
    too_big = client.post("/nodes/99999999999999999999/poll", json={}, headers=node.headers)
    assert too_big.status_code in (403, 422)
    assert routed == []  # each refused by FastAPI before its route ran


def test_a_revoked_or_unknown_node_is_refused_by_the_lane_and_counted(
    tmp_path: Path, routed: list[str]
) -> None:
    # Without tokens (loopback), any node id may be asked for: an unknown one is a 404.
    with (
        ThreadedServer(make_settings(tmp_path, poll_wait_s=0.5)) as server,
        httpx.Client(base_url=server.url, timeout=10) as client,
    ):
        node = ProtocolNode(client, "lane-node")
        heartbeat = f"/nodes/{node.node_id + 1}/heartbeat"
        before = request_count(client, "/nodes/{node_id}/heartbeat", 404)
        missing = client.post(heartbeat, json={"active_part_ids": []})
        assert missing.status_code == 404
        assert missing.json() == {"detail": f"node {node.node_id + 1} not found; register again"}
        assert request_count(client, "/nodes/{node_id}/heartbeat", 404) == before + 1
        polls = request_count(client, "/nodes/{node_id}/poll", 200)
        node.poll()
        assert request_count(client, "/nodes/{node_id}/poll", 200) == polls + 1
    assert routed == []


def test_a_parts_start_and_finish_skip_routing_and_settle_the_job_as_the_routes_would(
    served: tuple[ThreadedServer, httpx.Client], routed_parts: list[int]
) -> None:
    _, client = served
    node = ProtocolNode(client, "lane-node", JOIN)
    job_id, part_id = placed_part(client, node)
    counted = request_count(client, "/parts/{part_id}/started", 200)
    started = client.post(
        f"/parts/{part_id}/started", json={"node_id": node.node_id}, headers=node.headers
    )
    assert started.status_code == 200 and started.json() == {"accepted": True}
    assert request_count(client, "/parts/{part_id}/started", 200) == counted + 1
    [part] = client.get(f"/jobs/{job_id}", headers=bearer(USER)).json()["parts"]
    assert part["status"] == "running" and part["started_at"] is not None

    finished = node.finish(part_id, "failed", exit_code=3, message="lane")
    assert finished.status_code == 200 and finished.json() == {"accepted": True}
    job = client.get(f"/jobs/{job_id}", headers=bearer(USER)).json()
    assert job["status"] == "failed" and job["error"]["exit_code"] == 3
    # Said again, a finish changes nothing, as the route says it.
    again = node.finish(part_id, "succeeded")
    assert again.status_code == 200 and again.json() == {"accepted": False}
    assert client.get(f"/jobs/{job_id}", headers=bearer(USER)).json()["status"] == "failed"
    assert routed_parts == []  # none of them went through FastAPI's routing


def test_what_is_wrong_with_a_parts_report_is_said_as_the_routes_say_it(
    served: tuple[ThreadedServer, httpx.Client], routed_parts: list[int]
) -> None:
    _, client = served
    node = ProtocolNode(client, "lane-node", JOIN)
    other = ProtocolNode(client, "other-node", JOIN)
    job_id, part_id = placed_part(client, node)
    started = f"/parts/{part_id}/started"

    # Refused by the lane itself, from the domain's answer.
    not_its_own = client.post(started, json={"node_id": other.node_id}, headers=other.headers)
    assert not_its_own.status_code == 403 and f"part {part_id}" in not_its_own.text
    missing = client.post(
        f"/parts/{part_id + 1000}/finish",
        json={"node_id": node.node_id, "status": "succeeded"},
        headers=node.headers,
    )
    assert missing.status_code == 404 and f"part {part_id + 1000}" in missing.text
    assert routed_parts == []

    # Handed on to FastAPI, whose answer names what is wrong.
    for_another = client.post(started, json={"node_id": other.node_id}, headers=node.headers)
    assert for_another.status_code == 403 and f"node {node.node_id}'s" in for_another.text
    bad_status = node.finish(part_id, "done")
    assert bad_status.status_code == 422 and "status" in bad_status.json()["detail"][0]["msg"]
    unknown_field = client.post(
        started, json={"node_id": node.node_id, "when": 1}, headers=node.headers
    )
    assert unknown_field.status_code == 422 and "when" in unknown_field.text
    query = client.post(f"{started}?at=1", json={"node_id": node.node_id}, headers=node.headers)
    assert query.status_code == 422 and "at" in query.text
    too_big = client.post(
        "/parts/99999999999999999999/started", json={"node_id": node.node_id}, headers=node.headers
    )
    assert too_big.status_code == 422
    assert routed_parts == [other.node_id]  # the one that got past validation
    # None of it changed the part.
    [part] = client.get(f"/jobs/{job_id}", headers=bearer(USER)).json()["parts"]
    assert part["status"] == "assigned" and part["started_at"] is None


def test_a_report_that_fails_in_the_server_is_a_500_counted_under_its_route(
    served: tuple[ThreadedServer, httpx.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, client = served
    node = ProtocolNode(client, "lane-node", JOIN)
    _, part_id = placed_part(client, node)

    def broken(*args: Any) -> bool:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(reports, "finish_part", broken)
    before = request_count(client, "/parts/{part_id}/finish", 500)
    failed = node.finish(part_id, "succeeded")
    assert failed.status_code == 500
    assert request_count(client, "/parts/{part_id}/finish", 500) == before + 1
