"""What keeps one client from exhausting the server: a cap on request
bodies (checkpoints have their own), and CORS closed unless configured."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.host_check import allowed_hosts, host_of
from tests.api.conftest import ProtocolNode, ThreadedServer, make_settings, wait_for
from worker.client import ServerClient, ServerUnavailable


@pytest.fixture
def small(tmp_path: Path) -> Iterator[httpx.Client]:
    settings = make_settings(
        tmp_path, poll_wait_s=0.0, max_body_kb=1, artifacts_dir=tmp_path / "artifacts"
    )
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


def test_a_body_over_the_cap_is_refused_before_it_is_read(small: httpx.Client) -> None:
    big = {"name": "x" * 90, "topology": {"num_machines": 1}, "padding": " " * 2000}
    declared = small.post("/jobs", json=big)
    assert declared.status_code == 413
    assert declared.json()["detail"].startswith("body: larger than 1024 bytes")

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams
        yield b'{"name": "'
        for _ in range(64):
            yield b"x" * 64
        yield b'"}'

    streamed = small.post("/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    assert small.get("/jobs").json()["count"] == 0  # nothing half-made
    assert small.post("/jobs", json={"name": "fits"}).status_code == 201


def test_checkpoints_have_their_own_limit(small: httpx.Client) -> None:
    node = ProtocolNode(small, "a")
    small.post("/jobs", json={}).raise_for_status()
    [assignment] = node.poll()["start"]
    part = assignment["part_id"]
    small.post(f"/parts/{part}/started", json={"node_id": node.node_id}).raise_for_status()
    uploaded = small.put(
        f"/parts/{part}/checkpoint",
        params={"node_id": node.node_id, "epoch": 1},
        content=b"\0" * 8192,
        headers={"content-type": "application/octet-stream"},
    )
    assert uploaded.status_code == 200 and uploaded.json() == {"accepted": True}


PREFLIGHT = {
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


def test_cors_is_closed_unless_configured(tmp_path: Path) -> None:
    with (
        ThreadedServer(make_settings(tmp_path)) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        origin = {"Origin": "https://elsewhere.example"}
        preflight = client.options("/jobs", headers={**origin, **PREFLIGHT})
        assert "access-control-allow-origin" not in preflight.headers
        assert "access-control-allow-origin" not in client.get("/jobs", headers=origin).headers


def test_configured_origins_may_call_with_a_token(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path, cors_origins="https://dash.example", read_token="read-1b3d5f-Tn8c2Wm6Qa4z"
    )
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url) as client:
        allowed = {"Origin": "https://dash.example"}
        preflight = client.options("/jobs", headers={**allowed, **PREFLIGHT})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "https://dash.example"
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
        read = client.get(
            "/jobs", headers={**allowed, "Authorization": "Bearer read-1b3d5f-Tn8c2Wm6Qa4z"}
        )
        assert read.status_code == 200
        assert read.headers["access-control-allow-origin"] == "https://dash.example"
        other = {"Origin": "https://elsewhere.example"}
        assert client.options("/jobs", headers={**other, **PREFLIGHT}).status_code == 400
        assert "access-control-allow-origin" not in client.get("/jobs", headers=other).headers


def test_a_request_naming_a_foreign_host_is_refused(tmp_path: Path) -> None:
    """DNS rebinding: a page's own name pointed at 127.0.0.1 still arrives
    as that name in the Host header."""
    with (
        ThreadedServer(make_settings(tmp_path)) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        port = server.url.rsplit(":", 1)[1]
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example"):
            refused = client.post("/jobs", json={}, headers={"Host": host})
            assert refused.status_code == 400, host
            assert refused.json()["detail"].startswith(f"Host: {host!r} is not a name")
        assert client.get("/jobs").status_code == 200  # 127.0.0.1:port
        for host in (f"localhost:{port}", "LOCALHOST", f"[::1]:{port}"):
            assert client.get("/jobs", headers={"Host": host}).status_code == 200, host
        assert client.get("/jobs", headers={"Host": ""}).status_code == 400


def test_allowed_hosts_follow_the_bound_address_unless_configured() -> None:
    assert allowed_hosts("0.0.0.0", []) is None  # every address: any name it is reached by
    assert allowed_hosts("127.0.0.1", ["*"]) is None
    assert allowed_hosts("10.0.0.5", ["ddpo.example"]) == ["ddpo.example"]
    assert {"10.0.0.5", "localhost", "127.0.0.1"} <= set(allowed_hosts("10.0.0.5", []) or [])
    assert host_of("[::1]:8000") == "::1" and host_of("a.example:80") == "a.example"
    assert host_of("::1") == "::1"


def test_a_write_from_a_page_of_another_origin_is_refused(tmp_path: Path) -> None:
    """A form post or a no-cors fetch needs no preflight, but the browser
    says where it comes from."""
    settings = make_settings(tmp_path, cors_origins="https://dash.example")
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url) as client:
        job_id = client.post("/jobs", json={}).json()["id"]
        for origin in ("https://evil.example", "null", f"{server.url}.evil.example"):
            refused = client.post(f"/jobs/{job_id}/cancel", headers={"Origin": origin})
            assert refused.status_code == 403, origin
            assert refused.json()["detail"].startswith(f"Origin: pages of {origin!r}")
        assert client.get(f"/jobs/{job_id}").json()["status"] == "queued"
        # The server's own dashboard, and an origin it was told of, may.
        assert client.get("/jobs", headers={"Origin": "https://evil.example"}).status_code == 200
        assert client.post("/jobs", json={}, headers={"Origin": server.url}).status_code == 201
        allowed = client.post(f"/jobs/{job_id}/cancel", headers={"Origin": "https://dash.example"})
        assert allowed.json()["status"] == "cancelled"


def register(client: httpx.Client, name: str) -> httpx.Response:
    return client.post("/nodes/register", json={"name": name, "address": "127.0.0.1"})


def test_new_nodes_beyond_the_limit_are_refused_until_one_is_revoked(tmp_path: Path) -> None:
    with (
        ThreadedServer(make_settings(tmp_path, max_nodes=2)) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        a = register(client, "a").json()["node_id"]
        assert register(client, "b").status_code == 200
        refused = register(client, "c")
        assert refused.status_code == 403
        assert "DDPO_MAX_NODES=2" in refused.json()["detail"]
        assert register(client, "b").status_code == 200  # a known node comes back
        client.post(f"/nodes/{a}/revoke").raise_for_status()
        assert register(client, "c").status_code == 200


def test_new_nodes_beyond_the_join_rate_are_told_when_to_come_back(tmp_path: Path) -> None:
    with (
        ThreadedServer(make_settings(tmp_path, registrations_per_minute=3)) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        for name in ("a", "b", "c"):
            assert register(client, name).status_code == 200
        refused = register(client, "d")
        assert refused.status_code == 429
        assert "DDPO_REGISTRATIONS_PER_MINUTE" in refused.json()["detail"]
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        assert register(client, "a").status_code == 200  # not a new node: not counted


def test_nodes_come_a_page_at_a_time(tmp_path: Path) -> None:
    with (
        ThreadedServer(make_settings(tmp_path, max_page_size=3)) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        ids = [register(client, f"n{i}").json()["node_id"] for i in range(5)]
        client.post(f"/nodes/{ids[1]}/revoke").raise_for_status()
        first = client.get("/nodes", params={"limit": 100}).json()  # capped at the page size
        assert [n["id"] for n in first["data"]] == ids[:3] and first["count"] == 5
        rest = client.get("/nodes", params={"limit": 3, "offset": 3}).json()
        assert [n["id"] for n in rest["data"]] == ids[3:]
        live = client.get("/nodes", params={"state": "live"}).json()
        assert live["count"] == 4 and ids[1] not in [n["id"] for n in live["data"]]


def test_a_worker_takes_a_429_as_try_again_later() -> None:
    answer = httpx.Response(429, text="too many", request=httpx.Request("POST", "http://x/"))
    with pytest.raises(ServerUnavailable, match="429"):
        ServerClient._check("/nodes/register", answer)


def test_every_string_a_node_registers_with_is_bounded(tmp_path: Path) -> None:
    with (
        ThreadedServer(make_settings(tmp_path)) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        body = {"name": "a", "address": "127.0.0.1"}
        for field, value in (
            ("trainers", ["x" * 65]),
            ("trainers", ["t"] * 65),
            ("address", "a" * 256),
            ("name", "n" * 65),
        ):
            refused = client.post("/nodes/register", json={**body, field: value})
            assert refused.status_code == 422, (field, refused.text)
            assert refused.json()["detail"][0]["msg"].startswith(field), refused.text


def test_one_address_cannot_take_every_connection(tmp_path: Path) -> None:
    """A host holding DDPO_CONNECTIONS_PER_ADDRESS connections gets 503 for
    the next; another address is served, and a closed one makes room."""
    settings = make_settings(tmp_path, connections_per_address=5)
    with ThreadedServer(settings) as server:
        held = [socket.create_connection(("127.0.0.1", settings.port)) for _ in range(5)]
        try:
            with socket.create_connection(("127.0.0.1", settings.port)) as one_more:
                one_more.settimeout(10)
                answer = one_more.recv(4096)
            assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
            assert b"DDPO_CONNECTIONS_PER_ADDRESS" in answer
            elsewhere = httpx.HTTPTransport(local_address="127.0.0.2")
            with httpx.Client(base_url=server.url, transport=elsewhere, timeout=10) as other:
                assert other.get("/healthz").status_code == 200
        finally:
            for sock in held:
                sock.close()

        def served() -> bool:
            with httpx.Client(base_url=server.url, timeout=10) as again:
                try:
                    return again.get("/healthz").status_code == 200
                except httpx.HTTPError:
                    return False

        wait_for(served, what="the address served again once its connections closed")
