"""People, not roles: per-person keys an admin hands out, the owner of each
job and study, who may steer whose, and the audit log of it all."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.__main__ import main as cli
from tests.api.conftest import ProtocolNode, ThreadedServer, bearer, make_settings

ADMIN_TOKEN = "admin-7c2e9a1f4b-Wq3n8Rk5tY"
USER_TOKEN = "user-4b8d1f6a2c-Zm5p0Hs7vX"
JOIN_TOKEN = "join-9e3a7c5b1d-Jt6r2Lw8qP"


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[ThreadedServer]:
    settings = make_settings(
        tmp_path,
        poll_wait_s=0.0,
        sweep_interval_s=0.2,
        admin_token=ADMIN_TOKEN,
        user_token=USER_TOKEN,
        join_token=JOIN_TOKEN,
    )
    with ThreadedServer(settings) as server:
        yield server


@pytest.fixture
def http(guarded: ThreadedServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=guarded.url, timeout=10) as client:
        yield client


ADMIN = bearer(ADMIN_TOKEN)


def new_key(http: httpx.Client, name: str, role: str = "user") -> dict[str, Any]:
    made = http.post("/keys", json={"name": name, "role": role}, headers=ADMIN)
    assert made.status_code == 201, made.text
    body: dict[str, Any] = made.json()
    return body


def as_key(key: dict[str, Any]) -> dict[str, str]:
    return bearer(key["key"])


def audit(http: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    answer = http.get("/audit", params=params, headers=ADMIN)
    assert answer.status_code == 200, answer.text
    entries: list[dict[str, Any]] = answer.json()["data"]
    return entries


def test_a_key_is_shown_once_kept_hashed_and_acts_with_its_role(http: httpx.Client) -> None:
    alice = new_key(http, "alice")
    assert alice["key"].startswith("ddpo-key-") and alice["role"] == "user"
    assert alice["created_by"] == "token:admin"
    listed = http.get("/keys", headers=ADMIN)
    assert listed.status_code == 200
    assert [k["name"] for k in listed.json()["data"]] == ["alice"]
    assert alice["key"] not in listed.text and "key" not in listed.json()["data"][0]
    assert http.get("/whoami", headers=as_key(alice)).json() == {"name": "alice", "role": "user"}
    assert http.get("/jobs", headers=as_key(alice)).status_code == 200
    # A user's key is not an admin's.
    assert http.get("/keys", headers=as_key(alice)).status_code == 403
    assert http.get("/audit", headers=as_key(alice)).status_code == 403
    made = http.post("/keys", json={"name": "mallory", "role": "admin"}, headers=as_key(alice))
    assert made.status_code == 403
    # A reader's key reads, and submits nothing.
    dash = new_key(http, "wall-dashboard", role="reader")
    assert http.get("/queue", headers=as_key(dash)).status_code == 200
    assert http.post("/jobs", json={}, headers=as_key(dash)).status_code == 403


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "alice", "role": "node"}, "role"),
        ({"name": "alice", "role": "join"}, "role"),
        ({"name": "alice", "role": "root"}, "role"),
        ({"name": "Alice Smith", "role": "user"}, "name"),
        ({"name": "token:admin", "role": "admin"}, "name"),
        ({"role": "user"}, "name"),
        ({"name": "alice", "role": "user", "secret": "mine"}, "secret"),
    ],
)
def test_a_bad_key_request_is_a_422_naming_the_field(
    http: httpx.Client, body: dict[str, Any], field: str
) -> None:
    answer = http.post("/keys", json=body, headers=ADMIN)
    assert answer.status_code == 422, answer.text
    assert any(d["msg"].startswith(f"{field}:") for d in answer.json()["detail"]), answer.text


def test_a_name_is_never_given_twice_not_even_after_revoking(http: httpx.Client) -> None:
    alice = new_key(http, "alice")
    again = http.post("/keys", json={"name": "alice", "role": "admin"}, headers=ADMIN)
    assert again.status_code == 409 and "name: " in again.json()["detail"]
    assert http.post(f"/keys/{alice['id']}/revoke", headers=ADMIN).status_code == 200
    again = http.post("/keys", json={"name": "alice", "role": "user"}, headers=ADMIN)
    assert again.status_code == 409


def test_revoking_a_key_refuses_it_at_once(http: httpx.Client) -> None:
    alice = new_key(http, "alice")
    assert http.post("/jobs", json={}, headers=as_key(alice)).status_code == 201
    revoked = http.post(f"/keys/{alice['id']}/revoke", headers=ADMIN)
    assert revoked.status_code == 200
    assert revoked.json()["revoked_by"] == "token:admin" and revoked.json()["revoked_at"]
    # The very next request, with no wait.
    assert http.get("/jobs", headers=as_key(alice)).status_code == 401
    assert http.post("/jobs", json={}, headers=as_key(alice)).status_code == 401
    assert http.post(f"/keys/{alice['id']}/revoke", headers=ADMIN).status_code == 409
    assert http.post("/keys/999/revoke", headers=ADMIN).status_code == 404
    # The job keeps its owner; the key stays listed, revoked.
    assert http.get("/jobs", headers=ADMIN).json()["data"][0]["owner"] == "alice"
    [listed] = http.get("/keys", headers=ADMIN).json()["data"]
    assert listed["revoked_at"] is not None


def test_only_a_jobs_owner_or_an_admin_may_steer_it(http: httpx.Client) -> None:
    alice, bob = new_key(http, "alice"), new_key(http, "bob")
    carol = new_key(http, "carol", "admin")
    job = http.post("/jobs", json={"name": "alices"}, headers=as_key(alice)).json()
    assert job["owner"] == "alice" and job["status"] == "queued"  # no node: it waits
    url = f"/jobs/{job['id']}"

    refused = http.patch(url, json={"priority": 5}, headers=as_key(bob))
    assert refused.status_code == 403
    assert refused.json()["detail"] == (
        f"job {job['id']} is alice's: only its owner or an admin may change the priority of it"
    )
    assert http.post(f"{url}/cancel", headers=as_key(bob)).status_code == 403
    assert http.get(url, headers=ADMIN).json()["status"] == "queued"  # untouched
    assert http.get(url, headers=ADMIN).json()["priority"] == 0
    # The shared user token is not alice either.
    assert http.patch(url, json={"priority": 5}, headers=bearer(USER_TOKEN)).status_code == 403

    assert http.patch(url, json={"priority": 3}, headers=as_key(alice)).status_code == 200
    assert http.patch(url, json={"priority": 9}, headers=ADMIN).json()["priority"] == 9
    cancelled = http.post(f"{url}/cancel", headers=as_key(carol))
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"

    entries = audit(http, target=f"job {job['id']}")
    assert [(e["action"], e["actor"], e["role"]) for e in reversed(entries)] == [
        ("job.submit", "alice", "user"),
        ("job.priority", "alice", "user"),
        ("job.priority", "token:admin", "admin"),
        ("job.cancel", "carol", "admin"),
    ]
    assert entries[1]["detail"] == {"from": 3, "to": 9}
    assert {e["address"] for e in entries} == {"127.0.0.1"}
    # What was refused changed nothing, so it is not in the log.
    assert audit(http, actor="bob") == []


def test_a_study_is_its_submitters_and_so_are_its_jobs(http: httpx.Client) -> None:
    alice, bob = new_key(http, "alice"), new_key(http, "bob")
    study = http.post("/studies", json={"name": "scaling"}, headers=as_key(alice)).json()
    assert study["owner"] == "alice"
    jobs = http.get("/jobs", headers=ADMIN).json()["data"]
    assert {j["owner"] for j in jobs} == {"alice"}
    assert http.post(f"/studies/{study['id']}/cancel", headers=as_key(bob)).status_code == 403
    assert http.post(f"/jobs/{jobs[0]['id']}/cancel", headers=as_key(bob)).status_code == 403
    assert http.post(f"/studies/{study['id']}/cancel", headers=as_key(alice)).status_code == 200
    actions = [(e["action"], e["target"]) for e in audit(http, actor="alice")]
    assert actions == [
        ("study.cancel", f"study {study['id']}"),
        ("study.submit", f"study {study['id']}"),
    ]


def test_the_audit_log_records_key_changes_and_node_revocations(
    http: httpx.Client, guarded: ThreadedServer
) -> None:
    carol = new_key(http, "carol", "admin")
    dave = http.post("/keys", json={"name": "dave", "role": "reader"}, headers=as_key(carol))
    assert dave.status_code == 201 and dave.json()["created_by"] == "carol"
    node = ProtocolNode(http, "node-x", JOIN_TOKEN)
    assert http.post(f"/nodes/{node.node_id}/revoke", headers=as_key(carol)).status_code == 200
    # Revoking a revoked node changes nothing, and records nothing.
    assert http.post(f"/nodes/{node.node_id}/revoke", headers=ADMIN).status_code == 200
    assert http.post(f"/keys/{dave.json()['id']}/revoke", headers=as_key(carol)).status_code == 200

    entries = audit(http)
    assert [(e["actor"], e["action"], e["target"]) for e in reversed(entries)] == [
        ("token:admin", "key.create", f"key {carol['id']}"),
        ("carol", "key.create", f"key {dave.json()['id']}"),
        ("carol", "node.revoke", f"node {node.node_id}"),
        ("carol", "key.revoke", f"key {dave.json()['id']}"),
    ]
    assert entries[-1]["detail"] == {"name": "carol", "role": "admin"}
    assert entries[1]["detail"] == {"name": "node-x", "parts_stopped": 0}
    # Filters, and pages (newest first).
    assert [e["action"] for e in audit(http, action="node.revoke")] == ["node.revoke"]
    first = http.get("/audit", params={"limit": 3}, headers=ADMIN).json()
    assert len(first["data"]) == 3 and first["next_before"] == first["data"][-1]["id"]
    rest = http.get("/audit", params={"before": first["next_before"]}, headers=ADMIN).json()
    assert [e["id"] for e in first["data"] + rest["data"]] == [e["id"] for e in entries]
    assert rest["next_before"] is None
    bad = http.get("/audit", params={"action": "job.delete"}, headers=ADMIN)
    assert bad.status_code == 422 and "action" in bad.text


def test_one_idempotency_key_is_one_submitters(http: httpx.Client) -> None:
    alice, bob = new_key(http, "alice"), new_key(http, "bob")
    once = {"Idempotency-Key": "nightly-1"}
    first = http.post("/jobs", json={}, headers={**as_key(alice), **once})
    assert first.status_code == 201
    again = http.post("/jobs", json={}, headers={**as_key(alice), **once})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    other = http.post("/jobs", json={}, headers={**as_key(bob), **once})
    assert other.status_code == 409 and "another submitter" in other.json()["detail"]
    assert len(audit(http, action="job.submit")) == 1


def test_the_queue_names_each_jobs_owner(http: httpx.Client) -> None:
    alice = new_key(http, "alice")
    http.post("/jobs", json={}, headers=as_key(alice)).raise_for_status()
    http.post("/jobs", json={}, headers=bearer(USER_TOKEN)).raise_for_status()
    queue = http.get("/queue", headers=ADMIN).json()
    assert [j["owner"] for j in queue["data"]] == ["alice", "token:user"]


def test_the_cli_creates_lists_and_revokes_keys_and_reads_the_audit_log(
    guarded: ThreadedServer,
    http: httpx.Client,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DDPO_TOKEN", ADMIN_TOKEN)
    server = ["--server", guarded.url]
    assert cli(["keys", "create", *server, "erin", "--role", "user"]) == 0
    made = capsys.readouterr().out.splitlines()
    assert made[0] == "key 1: erin (user)" and made[1].startswith("ddpo-key-")
    erin = made[1]
    assert http.get("/whoami", headers=bearer(erin)).json()["name"] == "erin"

    assert cli(["keys", "list", *server]) == 0
    listed = capsys.readouterr().out
    assert "erin" in listed and "token:admin" in listed and erin not in listed

    monkeypatch.setenv("DDPO_TOKEN", erin)
    assert cli(["submit", *server]) == 0
    capsys.readouterr()
    assert cli(["list", *server]) == 0
    [row] = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("1 ")]
    assert row.split()[-1] == "erin"  # the owner column (the job has no name)
    assert cli(["keys", "list", *server]) == 1  # a user's key lists no keys
    said = capsys.readouterr().err
    assert "the user role may not do this" in said and "an admin's for keys" in said
    job = http.post("/jobs", json={}, headers=ADMIN).json()
    assert cli(["cancel", *server, str(job["id"])]) == 1  # not erin's job
    said = capsys.readouterr().err
    assert f"job {job['id']} is token:admin's: only its owner or an admin" in said
    assert "DDPO_TOKEN" not in said  # no token of erin's would help

    monkeypatch.setenv("DDPO_TOKEN", ADMIN_TOKEN)
    assert cli(["keys", "revoke", *server, "erin"]) == 0
    assert capsys.readouterr().out.strip() == "key 1 (erin) revoked"
    assert http.get("/jobs", headers=bearer(erin)).status_code == 401
    assert cli(["keys", "revoke", *server, "nobody"]) == 1
    assert "no key is named 'nobody'" in capsys.readouterr().err

    assert cli(["audit", *server]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [row.split()[3:6] for row in rows] == [
        ["token:admin", "127.0.0.1", "key.revoke"],
        ["token:admin", "127.0.0.1", "job.submit"],
        ["erin", "127.0.0.1", "job.submit"],
        ["token:admin", "127.0.0.1", "key.create"],
    ]
    assert cli(["audit", *server, "--actor", "erin", "--json"]) == 0
    [entry] = json.loads(capsys.readouterr().out)["data"]
    assert entry["action"] == "job.submit" and entry["target"] == "job 1"


def test_the_audit_log_records_the_peer_not_what_a_header_claims(
    http: httpx.Client, tmp_path: Path
) -> None:
    spoofed = {**ADMIN, "X-Forwarded-For": "203.0.113.9"}
    http.post("/keys", json={"name": "erin", "role": "user"}, headers=spoofed).raise_for_status()
    assert [e["address"] for e in audit(http)] == ["127.0.0.1"]
    # Behind a proxy the operator named, the header names the client.
    (tmp_path / "behind").mkdir()
    behind = make_settings(
        tmp_path / "behind", admin_token=ADMIN_TOKEN, trusted_proxies="127.0.0.1"
    )
    with ThreadedServer(behind) as server, httpx.Client(base_url=server.url) as proxied:
        made = proxied.post("/keys", json={"name": "frank", "role": "user"}, headers=spoofed)
        assert made.status_code == 201, made.text
        entries = proxied.get("/audit", headers=ADMIN).json()["data"]
    assert [e["address"] for e in entries] == ["203.0.113.9"]


def test_one_person_cannot_fill_the_queue(tmp_path: Path) -> None:
    """Nothing limited one person's queued jobs (every submit and placement
    pays for the queue): DDPO_MAX_QUEUED_JOBS_PER_PERSON, a 429 beyond."""
    settings = make_settings(
        tmp_path, admin_token=ADMIN_TOKEN, user_token=USER_TOKEN, max_queued_jobs_per_person=3
    )
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url, timeout=10) as c:
        alice = as_key(new_key(c, "alice"))
        bob = as_key(new_key(c, "bob"))
        # No node: every job stays queued.
        for _ in range(2):
            assert c.post("/jobs", json={}, headers=alice).status_code == 201
        study = {"rows": [{"num_machines": 1, "num_processes": 1, "batch_size": 64}] * 2}
        refused_study = c.post("/studies", json=study, headers=alice)
        assert refused_study.status_code == 429, refused_study.text
        resent = {**alice, "Idempotency-Key": "third"}
        assert c.post("/jobs", json={}, headers=resent).status_code == 201
        # A resend of a job already queued is not a new one.
        assert c.post("/jobs", json={}, headers=resent).status_code == 200
        refused = c.post("/jobs", json={}, headers=alice)
        assert refused.status_code == 429, refused.text
        assert refused.json()["detail"] == (
            "alice has 3 queued job(s); DDPO_MAX_QUEUED_JOBS_PER_PERSON=3 allows 0 more: wait "
            "for some to start, or cancel some"
        )
        assert refused.headers["Retry-After"] == "30"
        # Someone else's queue is their own.
        assert c.post("/jobs", json={}, headers=bob).status_code == 201
        # A cancel makes room.
        first = c.get("/jobs", headers=ADMIN).json()["data"][-1]["id"]
        assert c.post(f"/jobs/{first}/cancel", headers=alice).status_code in (200, 202)
        assert c.post("/jobs", json={}, headers=alice).status_code == 201
