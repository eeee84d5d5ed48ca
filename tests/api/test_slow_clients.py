"""Clients that hold connections without finishing their part: a request
head that never ends, a reader that never reads. The server closes them in
time, and a node's polls go on meanwhile."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import ProtocolNode, ThreadedServer, make_settings, wait_for

HALF_A_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: sl"


def connect(port: int, receive_buffer: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:  # before connecting: the window is agreed then
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect(("127.0.0.1", port))
    return sock


def closed_after(sock: socket.socket, limit_s: float) -> tuple[float, int]:
    """Seconds until the server closed ``sock``, and the bytes read until then."""
    started = time.monotonic()
    sock.settimeout(limit_s)
    received = 0
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            received += len(chunk)
    return time.monotonic() - started, received


@pytest.mark.parametrize("sent", [b"", HALF_A_REQUEST], ids=["nothing", "half a request"])
def test_a_connection_that_sends_no_whole_request_head_is_closed(
    tmp_path: Path, sent: bytes
) -> None:
    settings = make_settings(tmp_path, header_timeout_s=1.0)
    with ThreadedServer(settings), connect(settings.port) as sock:
        sock.sendall(sent)
        waited, _ = closed_after(sock, limit_s=10)
    assert 0.9 <= waited < 5, f"closed after {waited:.1f} s, with a header timeout of 1 s"


def test_a_keep_alive_client_between_requests_is_not_cut_off_by_the_header_timeout(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path, header_timeout_s=0.5, keep_alive_s=5)
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url) as client:
        for _ in range(3):
            assert client.get("/healthz").status_code == 200
            time.sleep(0.7)  # idle longer than the header timeout, not the keep-alive one
        assert client.get("/healthz").status_code == 200


@contextlib.contextmanager
def logged_server(
    tmp_path: Path, **settings: float
) -> Iterator[tuple[ThreadedServer, ProtocolNode, int]]:
    """A server, a node running a job whose logs fill pages of about 1 MiB."""
    with (
        ThreadedServer(make_settings(tmp_path, **settings)) as server,
        httpx.Client(base_url=server.url, timeout=30) as c,
    ):
        job_id = c.post("/jobs", json={}).raise_for_status().json()["id"]
        node = ProtocolNode(c, "busy")
        part_id = wait_for(lambda: node.poll()["start"], what="an assignment")[0]["part_id"]
        c.post(f"/parts/{part_id}/started", json={"node_id": node.node_id}).raise_for_status()
        lines = [
            {"rank": 0, "offset": i * 4000, "text": "x" * 3990, "at": "2026-12-01T00:00:00Z"}
            for i in range(400)
        ]
        c.post(
            f"/parts/{part_id}/logs", json={"node_id": node.node_id, "lines": lines}
        ).raise_for_status()
        yield server, node, job_id


@pytest.fixture
def logged(tmp_path: Path) -> Iterator[tuple[ThreadedServer, ProtocolNode, int]]:
    with logged_server(
        tmp_path,
        heartbeat_timeout_s=3.0,
        poll_wait_s=1.0,
        sweep_interval_s=0.2,
        send_timeout_s=60.0,
        header_timeout_s=60.0,
    ) as served:
        yield served


def test_a_node_polls_on_time_while_100_slow_readers_hold_connections(
    logged: tuple[ThreadedServer, ProtocolNode, int],
) -> None:
    server, node, job_id = logged
    port = server.settings.port
    readers = []
    try:
        for since in range(100):
            sock = connect(port, receive_buffer=4096)
            # Each asks for a different 1 MiB page, then reads none of it.
            sock.sendall(
                f"GET /jobs/{job_id}/logs?since={since}&limit=10000 HTTP/1.1\r\n"
                "Host: 127.0.0.1\r\n\r\n".encode()
            )
            readers.append(sock)
        for _ in range(50):  # and as many that never finish their request
            sock = connect(port)
            sock.sendall(HALF_A_REQUEST)
            readers.append(sock)
        # Two heartbeat timeouts of polls with news held back: each answered
        # well within the long-poll wait plus a second, and the node stays live.
        waits = []
        until = time.monotonic() + 2 * server.settings.heartbeat_timeout_s
        while time.monotonic() < until:
            started = time.monotonic()
            node.poll(active=[], wait_s=server.settings.poll_wait_s)
            waits.append(time.monotonic() - started)
        states = {n["name"]: n["state"] for n in node.client.get("/nodes").json()["data"]}
        assert states["busy"] == "live"
        assert max(waits) < server.settings.poll_wait_s + 1.0, waits
    finally:
        for sock in readers:
            sock.close()


def test_a_reader_that_stops_reading_is_cut_off_after_the_send_timeout(tmp_path: Path) -> None:
    with logged_server(tmp_path, send_timeout_s=1.0, keep_alive_s=60) as (server, node, job_id):
        page = f"/jobs/{job_id}/logs?limit=10000"
        size = len(node.client.get(page).content)
        # 20 answers of a MiB, asked for at once: more than the sockets' buffers hold.
        request = f"GET {page} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
        readers = [connect(server.settings.port, receive_buffer=4096) for _ in range(3)]
        for sock in readers:
            sock.sendall(request * 20)
        time.sleep(3)  # the readers stall, past the send timeout (the point of the test)
        for sock in readers:
            # What was buffered, then the end (not 20 answers, then a kept-alive silence).
            _, received = closed_after(sock, limit_s=10)
            assert received < 20 * size
            sock.close()
        assert node.client.get("/healthz").status_code == 200


def test_a_body_that_drips_in_is_cut_off_and_a_slow_steady_one_is_not(tmp_path: Path) -> None:
    """A byte every 0.3 s never stalls for the body timeout (1 s), but past
    it comes at 3 bytes a second, under the floor of 100: cut off. A body
    sent at 650 bytes a second for 3 s arrives whole."""
    settings = make_settings(tmp_path, body_timeout_s=1.0, min_body_bytes_per_s=100)
    body = b'{"name": "steady", "padding": "' + b"x" * 1900 + b'"}'
    head = (
        f"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with ThreadedServer(settings) as server, connect(settings.port) as drip:
        drip.sendall(head)
        started = time.monotonic()
        cut_after = None
        for byte in body:
            try:
                drip.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                cut_after = time.monotonic() - started
                break
            time.sleep(0.3)
            if time.monotonic() - started > 10:
                break
        assert cut_after is not None and 1.0 <= cut_after < 5, cut_after

        with connect(settings.port) as steady:
            steady.sendall(head)
            for first in range(0, len(body), 200):
                steady.sendall(body[first : first + 200])
                time.sleep(0.3)
            steady.settimeout(10)
            answer = steady.recv(4096)
        assert answer.startswith(b"HTTP/1.1 422 "), answer  # read whole: "padding" is unknown
        with httpx.Client(base_url=server.url) as client:
            assert client.get("/jobs").json()["count"] == 0
