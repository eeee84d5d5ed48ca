"""Requests leave nothing in reference cycles: a thousand idle nodes send
hundreds of polls a second, and what each leaves for the garbage
collector's full passes, which stop the event loop while they walk the
oldest generation, was the slow tail of polls (BENCHMARKS.md, "The slow
tail at a 2 s poll wait")."""

from __future__ import annotations

import gc
import json
import socket
from pathlib import Path

import httpx

from tests.api.conftest import ProtocolNode, ThreadedServer, make_settings

JOIN = "join-token-for-garbage-tests-0123456789"
ADMIN = "admin-token-for-garbage-tests-012345678"
POLLS = 50


def poll_over(connection: socket.socket, node: ProtocolNode, port: int) -> None:
    """One poll held to its timeout (as an idle node's are), on a kept-alive
    connection, by hand: an HTTP client would leave garbage of its own."""
    body = json.dumps({"active_part_ids": [], "waiting_for_port": [], "wait_s": 0.01}).encode()
    head = (
        f"POST /nodes/{node.node_id}/poll HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {node.credential}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    connection.sendall(head.encode() + body)
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += connection.recv(65536)
    head_bytes, rest = answer.split(b"\r\n\r\n", 1)
    assert head_bytes.startswith(b"HTTP/1.1 200"), head_bytes
    length = next(
        int(line.split(b":")[1])
        for line in head_bytes.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        rest += connection.recv(65536)


def test_a_nodes_polls_leave_nothing_in_reference_cycles(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, join_token=JOIN, admin_token=ADMIN, poll_wait_s=0.5)
    with (
        ThreadedServer(settings) as server,
        httpx.Client(base_url=server.url, timeout=10) as client,
    ):
        node = ProtocolNode(client, "node-a", JOIN)
        with socket.create_connection(("127.0.0.1", settings.port), timeout=10) as connection:
            for _ in range(5):
                poll_over(connection, node, settings.port)
            gc.collect()
            gc.disable()
            try:
                for _ in range(POLLS):
                    poll_over(connection, node, settings.port)
                left_in_cycles = gc.collect()
            finally:
                gc.enable()
    # Each poll left 13 objects in one loop (its uvicorn cycle, its event,
    # its caller, ...) while the server's body-timeout wrapper held the
    # cycle that held it: 846 here.
    assert left_in_cycles < POLLS, left_in_cycles
