"""Authentication: every route of the app against every kind of caller, built
from the app's own route table (a route without a rule fails here)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from api.auth import PUBLIC, Role, rule_for
from api.routes import dashboard, reference
from cli.cluster import free_port
from tests.api.conftest import ProtocolNode, ThreadedServer, bearer, make_settings
from tests.conftest import REPO

TOKENS = {
    Role.ADMIN: "admin-3f1c9a7e5b-Qm8s2Kx7vR",
    Role.USER: "user-8d2e4b6a0c-Lp4w9Zt1nJ",
    Role.READER: "read-5a7c9e1b3d-Hc6y3Ub5mW",
    Role.JOIN: "join-2b4d6f8a0e-Fg2q7Ne4kT",
}
# Callers with no valid token, and what they send.
STRANGERS = {
    "no token": {},
    "malformed": {"Authorization": "Bearer"},
    "not bearer": {"Authorization": f"Basic {TOKENS[Role.ADMIN]}"},
    "wrong": {"Authorization": "Bearer not-a-token"},
}
# What the server says when it refuses a caller for who it is.
REFUSALS = ("bearer token", "role may", "this credential is", "runs no part of")


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
        join_token=TOKENS[Role.JOIN],
    )
    with ThreadedServer(settings) as server:
        yield server


def as_(role: Role) -> dict[str, str]:
    return bearer(TOKENS[role])


@dataclass
class World:
    """Real state for the matrix's ids: node A runs a part of a job; node B
    is another live node; node C is there to be revoked."""

    a: ProtocolNode
    b: ProtocolNode
    c: ProtocolNode
    job_id: int
    part_id: int


def make_world(client: httpx.Client) -> World:
    a = ProtocolNode(client, "node-a", TOKENS[Role.JOIN])
    job = client.post("/jobs", json={}, headers=as_(Role.USER)).raise_for_status().json()
    [assignment] = a.poll()["start"]
    b = ProtocolNode(client, "node-b", TOKENS[Role.JOIN])
    c = ProtocolNode(client, "node-c", TOKENS[Role.JOIN])
    return World(a, b, c, job["id"], assignment["part_id"])


def concrete(path: str, world: World | None = None) -> str:
    """A request path for a route template: the world's ids (else 1), a page
    name, a file name."""
    if world is not None:
        node = world.c if path.endswith("/revoke") else world.a
        path = path.replace("{node_id}", str(node.node_id))
        path = path.replace("{job_id}", str(world.job_id))
        path = path.replace("{part_id}", str(world.part_id))
    path = re.sub(r"\{[a-z_]+_id\}", "1", path)
    return path.replace("{page:path}", "jobs").replace("{name}", "app.js")


def request_for(method: str, template: str, node_id: int) -> dict[str, Any]:
    """A well-formed request (httpx keywords) acting for ``node_id``: a node
    refused must be refused for who it is, not for a malformed body."""
    if method == "PUT":
        return {"params": {"node_id": node_id, "epoch": 1}, "content": b"checkpoint"}
    if method != "POST":
        return {}
    bodies: dict[str, dict[str, Any]] = {
        "/nodes/register": {"name": "node-a", "address": "127.0.0.1"},
        "/nodes/{node_id}/poll": {"wait_s": 0},
        "/nodes/{node_id}/leave": {"grace_s": 20},
        "/parts/{part_id}/started": {"node_id": node_id},
        "/parts/{part_id}/tracking-run": {"node_id": node_id},
        "/parts/{part_id}/rendezvous": {"node_id": node_id, "master_port": 29500},
        "/parts/{part_id}/progress": {"node_id": node_id, "reports": []},
        "/parts/{part_id}/logs": {"node_id": node_id, "lines": []},
        "/parts/{part_id}/finish": {"node_id": node_id, "status": "cancelled"},
        "/parts/{part_id}/checkpoint/stored": {
            "node_id": node_id,
            "epoch": 1,
            "url": "s3://bucket/job-1/0123456789ab-epoch-1.pt",
            "size": 10,
            "sha256": "0" * 64,
        },
    }
    return {"json": bodies.get(template, {})}


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
    plain = [*app.routes, *dashboard.router.routes, *reference.router.routes]
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
    answers: list[str] = []
    counts = {"inside": 0, "outside": 0}
    with httpx.Client(base_url=guarded.url, timeout=10) as client:
        world = make_world(client)
        a, b = world.a.node_id, world.b.node_id
        # name -> (headers, role, the node it acts for, whether it is node A)
        callers: dict[str, tuple[dict[str, str], Role | None, int, bool]] = {
            name: (headers, None, a, False) for name, headers in STRANGERS.items()
        }
        callers.update({role.value: (as_(role), role, a, False) for role in TOKENS})
        callers["worker of node A"] = (world.a.headers, Role.NODE, a, True)
        # Node B impersonating node A, and node B naming itself on A's part.
        callers["worker of node B"] = (world.b.headers, Role.NODE, a, False)
        callers["worker of node B, as itself"] = (world.b.headers, Role.NODE, b, False)
        for method, template in routes:
            allowed = rule_for(method, template)
            assert allowed is not None
            for name, (headers, role, acts_for, is_a) in callers.items():
                response = client.request(
                    method,
                    concrete(template, world),
                    headers=headers,
                    **request_for(method, template, acts_for),
                )
                answers.append(response.text)
                in_role = role is not None and role in allowed
                # A node's credential is good for its own node's doings only.
                inside = allowed is PUBLIC or (in_role and (role is not Role.NODE or is_a))
                counts["inside" if inside else "outside"] += 1
                if inside:
                    refused_by_auth = any(text in response.text for text in REFUSALS)
                    if response.status_code in (401, 403) and refused_by_auth:
                        unexpected.append(f"{name}: {method} {template} refused")
                    continue
                want = 401 if role is None else 403
                if response.status_code != want:
                    unexpected.append(
                        f"{name}: {method} {template} got {response.status_code}, not {want}"
                        f" ({response.text[:120]})"
                    )
    assert unexpected == []
    assert counts["outside"] >= len(STRANGERS) * len(routes), counts

    # No token or node credential in anything the server logged or answered.
    logged = "\n".join(record.getMessage() for record in caplog.records)
    secrets = [*TOKENS.values(), world.a.credential, world.b.credential, world.c.credential]
    for secret in secrets:
        assert secret not in logged
        assert not any(secret in text for text in answers)


def test_a_join_token_cannot_submit_and_a_reader_cannot_cancel(
    guarded: ThreadedServer,
) -> None:
    with httpx.Client(base_url=guarded.url, timeout=10) as client:
        assert client.post("/jobs", json={}, headers=as_(Role.JOIN)).status_code == 403
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
        env={
            **env,
            "PYTHONPATH": str(REPO),
            "DATABASE_URL": "sqlite:///:memory:",
            "DDPO_NO_AUTH": "1",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "refusing to serve on 0.0.0.0" in done.stderr
    assert "DDPO_NO_AUTH" in done.stderr


@pytest.mark.parametrize(
    "tokens,named",
    [
        ({"DDPO_ADMIN_TOKEN": "x"}, ["DDPO_ADMIN_TOKEN is 1 characters long"]),
        (
            {"DDPO_USER_TOKEN": TOKENS[Role.USER], "DDPO_JOIN_TOKEN": TOKENS[Role.USER]},
            ["DDPO_USER_TOKEN and DDPO_JOIN_TOKEN are the same token"],
        ),
        (
            {"DDPO_ADMIN_TOKEN": TOKENS[Role.ADMIN], "DDPO_NO_AUTH": "1"},
            ["DDPO_NO_AUTH is set, and so are tokens"],
        ),
    ],
)
def test_a_weak_or_shared_token_stops_the_server_at_start(
    tokens: dict[str, str], named: list[str]
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPO_") or "TOKEN" not in k}
    done = subprocess.run(
        [sys.executable, "-m", "api", "--port", str(free_port())],
        env={**env, **tokens, "PYTHONPATH": str(REPO), "DATABASE_URL": "sqlite:///:memory:"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    for words in named:
        assert words in done.stderr
    assert "Traceback" not in done.stderr
