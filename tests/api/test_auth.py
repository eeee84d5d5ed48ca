"""Authentication: every route of the app against every kind of caller, built
from the app's own route table (a route without a rule fails here)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from api.auth import PUBLIC, Role, rule_for
from api.routes import dashboard
from cli.cluster import free_port
from tests.api.conftest import ThreadedServer, make_settings
from tests.conftest import REPO

TOKENS = {
    Role.ADMIN: "admin-3f1c9a7e5b",
    Role.USER: "user-8d2e4b6a0c",
    Role.READER: "read-5a7c9e1b3d",
    Role.WORKER: "worker-2b4d6f8a0e",
}
# Callers with no valid token, and what they send.
STRANGERS = {
    "no token": {},
    "malformed": {"Authorization": "Bearer"},
    "not bearer": {"Authorization": f"Basic {TOKENS[Role.ADMIN]}"},
    "wrong": {"Authorization": "Bearer not-a-token"},
}


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[ThreadedServer]:
    settings = make_settings(
        tmp_path,
        poll_wait_s=0.0,
        access_log=True,
        artifacts_dir=tmp_path / "artifacts",
        admin_token=TOKENS[Role.ADMIN],
        user_token=TOKENS[Role.USER],
        read_token=TOKENS[Role.READER],
        worker_token=TOKENS[Role.WORKER],
    )
    with ThreadedServer(settings) as server:
        yield server


def concrete(path: str) -> str:
    """A request path for a route template: ids 1, a page name, a file name."""
    path = re.sub(r"\{[a-z_]+_id\}", "1", path)
    return path.replace("{page:path}", "jobs").replace("{name}", "app.js")


def app_requests(server: ThreadedServer) -> list[tuple[str, str]]:
    """(method, route template) for every route the app serves: the OpenAPI
    document's, the routes FastAPI adds itself, and the dashboard's (kept out
    of the document)."""
    app = server.server.config.app
    assert isinstance(app, FastAPI)
    found = {
        (method.upper(), path)
        for path, operations in app.openapi()["paths"].items()
        for method in operations
    }
    plain = [*app.routes, *dashboard.router.routes]
    for route in plain:
        path = getattr(route, "path", None)
        for method in getattr(route, "methods", None) or ():
            if path is not None and method != "HEAD":
                found.add((method, path))
    return sorted(found)


def test_every_route_refuses_every_caller_outside_its_roles(
    guarded: ThreadedServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    routes = app_requests(guarded)
    assert len(routes) >= 30, routes
    missing = [f"{m} {p}" for m, p in routes if rule_for(m, p) is None]
    assert missing == [], f"routes without an access rule: {missing}"

    unexpected: list[str] = []
    bodies: list[str] = []
    with httpx.Client(base_url=guarded.url, timeout=10) as client:
        for method, template in routes:
            allowed = rule_for(method, template)
            assert allowed is not None
            callers: dict[str, tuple[dict[str, str], Role | None]] = {
                name: (headers, None) for name, headers in STRANGERS.items()
            }
            callers.update(
                {
                    role.value: ({"Authorization": f"Bearer {token}"}, role)
                    for role, token in TOKENS.items()
                }
            )
            for name, (headers, role) in callers.items():
                body: dict[str, object] | None = {} if method in ("POST", "PUT") else None
                response = client.request(method, concrete(template), headers=headers, json=body)
                bodies.append(response.text)
                inside = allowed is PUBLIC or (role is not None and role in allowed)
                if inside:
                    refused_by_auth = "bearer token" in response.text or "role may" in response.text
                    if response.status_code in (401, 403) and refused_by_auth:
                        unexpected.append(f"{name}: {method} {template} refused")
                    continue
                want = 401 if role is None else 403
                if response.status_code != want:
                    unexpected.append(
                        f"{name}: {method} {template} got {response.status_code}, not {want}"
                    )
    assert unexpected == []

    # No token in anything the server logged or answered.
    logged = "\n".join(record.getMessage() for record in caplog.records)
    for token in TOKENS.values():
        assert token not in logged
        assert not any(token in text for text in bodies)


def test_a_worker_token_cannot_submit_and_a_reader_cannot_cancel(
    guarded: ThreadedServer,
) -> None:
    def as_(role: Role) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKENS[role]}"}

    with httpx.Client(base_url=guarded.url, timeout=10) as client:
        assert client.post("/jobs", json={}, headers=as_(Role.WORKER)).status_code == 403
        job = client.post("/jobs", json={}, headers=as_(Role.USER))
        assert job.status_code == 201
        job_id = job.json()["id"]
        assert client.post(f"/jobs/{job_id}/cancel", headers=as_(Role.READER)).status_code == 403
        assert client.get(f"/jobs/{job_id}", headers=as_(Role.READER)).status_code == 200
        refused = client.get(f"/jobs/{job_id}")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Bearer")
        cancelled = client.post(f"/jobs/{job_id}/cancel", headers=as_(Role.ADMIN))
        assert cancelled.json()["status"] == "cancelled"


def test_the_server_will_not_serve_a_network_without_tokens() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPO_") or "TOKEN" not in k}
    done = subprocess.run(
        [sys.executable, "-m", "api", "--host", "0.0.0.0", "--port", str(free_port())],
        env={**env, "PYTHONPATH": str(REPO), "DATABASE_URL": "sqlite:///:memory:"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "refusing to serve on 0.0.0.0" in done.stderr
    assert "DDPO_ADMIN_TOKEN" in done.stderr
