"""Polls and heartbeats answered before routing (api/node_lane.py): the
same answers as the routes give, the same refusals for what is wrong with
a request, and counted in /metrics like every other request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.routes import nodes as node_routes
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
