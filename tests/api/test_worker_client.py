"""The worker's client given several servers: a server it cannot reach
costs it one call, and it carries on with the next."""

from __future__ import annotations

import pytest

from api.schemas import NodeRegistration
from cli.cluster import free_port
from tests.api.conftest import ThreadedServer
from worker.client import ServerClient, ServerUnavailable, server_urls


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
