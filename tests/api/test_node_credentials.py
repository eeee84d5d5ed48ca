"""Worker identities: a node's credential acts for that node only, a known
name is taken back only with its credential, and a revoked node is out."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import ProtocolNode, ThreadedServer, bearer, make_settings, wait_for

ADMIN = "admin-7c1e9a3b-Rw5t8Yq2Lm"
USER = "user-4f6b2d8e-Kd3n6Vb9Xs"
JOIN = "join-9a5c1e7f-Pz1h4Gj7Ce"


@pytest.fixture
def settings(tmp_path: Path) -> Any:
    return make_settings(
        tmp_path,
        poll_wait_s=0.0,
        sweep_interval_s=0.2,
        retry_backoff_s=0.0,
        artifacts_dir=tmp_path / "artifacts",
        admin_token=ADMIN,
        user_token=USER,
        join_token=JOIN,
    )


@pytest.fixture
def client(settings: Any) -> Iterator[httpx.Client]:
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


def submit(client: httpx.Client, **spec: Any) -> int:
    job = client.post("/jobs", json=spec, headers=bearer(USER)).raise_for_status().json()
    job_id: int = job["id"]
    return job_id


def job(client: httpx.Client, job_id: int) -> dict[str, Any]:
    found: dict[str, Any] = (
        client.get(f"/jobs/{job_id}", headers=bearer(USER)).raise_for_status().json()
    )
    return found


def test_a_node_reports_for_its_own_parts_and_no_other_nodes(client: httpx.Client) -> None:
    a = ProtocolNode(client, "node-a", JOIN)
    job_id = submit(client, max_steps_per_epoch=5)
    [assignment] = a.poll()["start"]
    part = assignment["part_id"]
    b = ProtocolNode(client, "node-b", JOIN)

    def report(node: ProtocolNode, route: str, acting_for: int, **body: Any) -> httpx.Response:
        return client.post(
            f"/parts/{part}/{route}", json={"node_id": acting_for, **body}, headers=node.headers
        )

    # Node B, whether it names node A or itself, gets nowhere with A's part.
    for acting_for in (a.node_id, b.node_id):
        assert report(b, "started", acting_for).status_code == 403
        assert report(b, "progress", acting_for, reports=[]).status_code == 403
        assert report(b, "finish", acting_for, status="failed").status_code == 403
    assert client.post(f"/nodes/{a.node_id}/poll", json={}, headers=b.headers).status_code == 403
    assert client.get(f"/jobs/{job_id}/model", headers=b.headers).status_code == 403
    assert job(client, job_id)["status"] == "running"

    # Node A does.
    assert report(a, "started", a.node_id).json() == {"accepted": True}
    finished = report(a, "finish", a.node_id, status="failed", reason="rank_failed")
    assert finished.json() == {"accepted": True}
    assert job(client, job_id)["status"] == "failed"
    # The join token joins and does nothing else; a node cannot act as a person.
    assert client.post(f"/nodes/{a.node_id}/poll", json={}, headers=bearer(JOIN)).status_code == 403
    assert client.post("/jobs", json={}, headers=a.headers).status_code == 403


def test_a_known_name_is_taken_back_only_with_its_credential(client: httpx.Client) -> None:
    a = ProtocolNode(client, "node-a", JOIN)
    b = ProtocolNode(client, "node-b", JOIN)
    body = {"name": "node-a", "address": "127.0.0.1"}
    taken = client.post("/nodes/register", json=body, headers=bearer(JOIN))
    assert taken.status_code == 409
    assert "node-a" in taken.json()["detail"] and "credential" in taken.json()["detail"]
    # Another node's credential cannot register as node A either.
    assert client.post("/nodes/register", json=body, headers=b.headers).status_code == 403
    # Node A's own does, and keeps it (the answer carries no new one).
    again = client.post("/nodes/register", json=body, headers=a.headers).raise_for_status()
    assert again.json()["node_id"] == a.node_id and again.json()["credential"] is None
    assert a.poll()["start"] == []


def test_credentials_outlive_a_server_restart(settings: Any) -> None:
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url) as client:
        a = ProtocolNode(client, "node-a", JOIN)
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url) as client:
        a.client = client
        assert a.poll()["start"] == []


def test_a_revoked_node_is_refused_and_its_job_restarts_elsewhere(client: httpx.Client) -> None:
    a = ProtocolNode(client, "node-a", JOIN)
    job_id = submit(client, max_steps_per_epoch=5, max_restarts=1)
    [assignment] = a.poll()["start"]
    client.post(
        f"/parts/{assignment['part_id']}/started", json={"node_id": a.node_id}, headers=a.headers
    ).raise_for_status()
    b = ProtocolNode(client, "node-b", JOIN)

    # Only an admin revokes.
    assert client.post(f"/nodes/{a.node_id}/revoke", headers=bearer(USER)).status_code == 403
    revoked = client.post(f"/nodes/{a.node_id}/revoke", headers=bearer(ADMIN))
    assert revoked.status_code == 200 and revoked.json()["state"] == "revoked"

    poll = client.post(f"/nodes/{a.node_id}/poll", json={}, headers=a.headers)
    assert poll.status_code == 401
    body = {"name": "node-a", "address": "127.0.0.1"}
    assert client.post("/nodes/register", json=body, headers=a.headers).status_code == 401
    rejoin = client.post("/nodes/register", json=body, headers=bearer(JOIN))
    assert rejoin.status_code == 403 and "revoked" in rejoin.json()["detail"]

    # Its job goes on, on node B, with the revocation as the first attempt's end.
    moved = wait_for(lambda: b.poll()["start"], 10, "the job to restart on node B")
    assert moved[0]["job_id"] == job_id
    attempts = job(client, job_id)["attempts"]
    assert attempts[0]["error"]["reason"] == "node_revoked"
    assert len(attempts) == 2
