"""A real uvicorn server on a free loopback port, in a thread of the test
process, over a real database (a SQLite file; PostgreSQL in CI's PostgreSQL
lane, tests/databases.py); tests speak HTTP to it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from api.core.context import Core
from api.main import create_app
from api.serving import uvicorn_options
from api.settings import ServerSettings
from cli.cluster import free_port
from tests.databases import fresh_database_url


class ThreadedServer:
    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        config = uvicorn.Config(
            create_app(settings),
            host="127.0.0.1",
            port=settings.port,
            log_level="warning",
            **uvicorn_options(settings),
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.port}"

    def app_core(self) -> Core:
        """The running server's core (its settings, its tracking, ...)."""
        core: Core = self.server.config.app.state.core
        return core

    def __enter__(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)


def make_settings(tmp_path: Path, **overrides: Any) -> ServerSettings:
    return ServerSettings(
        host="127.0.0.1",
        port=free_port(),
        database_url=fresh_database_url(tmp_path),
        **overrides,
    )


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ThreadedServer]:
    with ThreadedServer(make_settings(tmp_path, poll_wait_s=0.5, sweep_interval_s=0.2)) as s:
        yield s


@pytest.fixture
def client(server: ThreadedServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


class ProtocolNode:
    """Speaks the worker protocol by hand, to put the server in exact states."""

    def __init__(
        self, client: httpx.Client, name: str, join_token: str | None = None, **registration: Any
    ) -> None:
        self.client = client
        body = {"name": name, "address": "127.0.0.1", **registration}
        joined = client.post("/nodes/register", json=body, headers=bearer(join_token))
        registered = joined.raise_for_status().json()
        self.node_id: int = registered["node_id"]
        # The node's own credential: what it presents from now on.
        self.credential: str = registered["credential"]
        self.headers = bearer(self.credential)
        self.name = name

    def poll(
        self,
        active: list[int] | None = None,
        wait_s: float = 0,
        waiting_for_port: list[int] | None = None,
    ) -> dict[str, Any]:
        body = {
            "active_part_ids": active or [],
            "waiting_for_port": waiting_for_port or [],
            "wait_s": wait_s,
        }
        response = self.client.post(f"/nodes/{self.node_id}/poll", json=body, headers=self.headers)
        result: dict[str, Any] = response.raise_for_status().json()
        return result

    def finish(self, part_id: int, status: str, **fields: Any) -> httpx.Response:
        return self.client.post(
            f"/parts/{part_id}/finish",
            json={"node_id": self.node_id, "status": status, **fields},
            headers=self.headers,
        )


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def wait_for(predicate: Any, timeout_s: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
