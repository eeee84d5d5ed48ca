"""The worker's client given several servers: a server it cannot reach
costs it one call, and it carries on with the next. Its heartbeat says
nothing while polls are answered."""

from __future__ import annotations

import time

import httpx
import pytest

from cli.cluster import free_port
from ddpo.schemas import NodeRegistration
from tests.api.conftest import ThreadedServer, wait_for
from worker.client import ServerClient, ServerUnavailable, server_urls
from worker.heartbeat import Heartbeat


def test_server_urls_are_split_on_commas() -> None:
    assert server_urls("http://a:1/, http://b:2") == ["http://a:1", "http://b:2"]
    assert server_urls("http://a:1") == ["http://a:1"]


def test_a_server_that_cannot_be_reached_is_left_for_the_next(server: ThreadedServer) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    client = ServerClient(f"{dead},{server.url}", timeout_s=5)
    registration = NodeRegistration(name="two-servers", address="127.0.0.1")
    try:
        with pytest.raises(ServerUnavailable, match=dead):
            client.register(registration, token=None)
        assert client.url == server.url
        registered = client.register(registration, token=None)
        assert registered.node_id >= 1
        assert client.url == server.url  # it stays with the one that answers
    finally:
        client.close()


def heartbeats_served(server: ThreadedServer) -> float:
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("ddpo_http_request_duration_seconds_count")
        and 'route="/nodes/{node_id}/heartbeat"' in line
    )


def test_the_heartbeat_is_skipped_while_polls_are_answered(server: ThreadedServer) -> None:
    client = ServerClient(server.url, timeout_s=5)
    registered = client.register(NodeRegistration(name="beats", address="127.0.0.1"), token=None)
    stuck = {"since": float("inf")}  # polls answered all along, until then
    beat = Heartbeat(
        server_url=server.url,
        credential=registered.credential,
        node_id=registered.node_id,
        interval_s=0.05,
        active_part_ids=list,
        stop_parts=lambda _: None,
        polled_at=lambda: min(time.monotonic(), stuck["since"]),
    )
    try:
        before = heartbeats_served(server)
        beat.start()
        time.sleep(1.0)  # twenty intervals, each just after a poll's answer: no beat
        assert heartbeats_served(server) == before
        stuck["since"] = time.monotonic()  # the daemon is stuck from now: no poll answered
        wait_for(lambda: heartbeats_served(server) > before, 5, "a heartbeat")
    finally:
        beat.close()
        client.close()
