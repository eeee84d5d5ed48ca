"""A cluster with tokens, as every local cluster has: workers join with the
join token and act with their own node's credential, a job runs end to end,
a revoked worker is shut out, and no token appears in any log or answer."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from cli.cluster import ClusterTokens, LocalCluster, free_port
from tests.e2e.conftest import Jobs, ddpo_told_no_token, until

pytestmark = pytest.mark.e2e

TOKENS = ClusterTokens(
    admin="admin-token-0d3b5f7a9c-Xq4",
    user="user-token-6b1f0c9e2d-Wm7z",
    read="read-token-8e2a4c6b1f-Rt2k",
    join="join-token-4e8a2c7f1b-Hv9p",
)


def test_a_job_runs_with_tokens_and_no_log_shows_them(mnist_dir: Path, tmp_path: Path) -> None:
    with LocalCluster(
        state_dir=tmp_path / "cluster",
        data_dir=mnist_dir,
        workers=2,
        tokens=TOKENS,
        server_env={"DDPO_ACCESS_LOG": "true"},
    ) as cluster:
        assert httpx.get(f"{cluster.url}/jobs").status_code == 401
        with cluster.client() as client:
            jobs = Jobs(client)
            job_id = jobs.submit(machines=2, max_steps_per_epoch=5, max_restarts=1)
            job = jobs.wait_done(job_id, timeout_s=120)
            answers = [
                client.get(f"/jobs/{job_id}").text,
                client.get(f"/jobs/{job_id}/logs").text,
                client.get("/nodes").text,
            ]
        assert job["status"] == "succeeded", job["error"]
        # The join token does not let a machine act as a person.
        as_joiner = httpx.post(
            f"{cluster.url}/jobs", json={}, headers={"Authorization": f"Bearer {TOKENS.join}"}
        )
        assert as_joiner.status_code == 403
        # Each worker keeps its node's own credential, readable by it alone.
        # (beside its work directory, outside the tree its ranks run in).
        files = sorted(cluster.state_dir.glob("node-*/runs.node-credential"))
        assert len(files) == 2
        assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
        credentials = [f.read_text().strip() for f in files]
        assert len(set(credentials)) == 2 and TOKENS.join not in credentials
    logs = {p.name: p.read_text(errors="replace") for p in cluster.state_dir.rglob("*.log")}
    assert "GET /jobs" in logs["server.log"]  # the access log was on
    for secret in (*TOKENS.server_env().values(), *credentials):
        assert [name for name, text in logs.items() if secret in text] == []
        assert not any(secret in text for text in answers)


def test_a_revoked_worker_stops_and_its_job_restarts_on_another(
    mnist_dir: Path, tmp_path: Path
) -> None:
    with (
        LocalCluster(
            state_dir=tmp_path / "cluster", data_dir=mnist_dir, workers=2, tokens=TOKENS
        ) as cluster,
        cluster.client() as client,
        cluster.client("admin") as admin,
    ):
        jobs = Jobs(client)
        job_id = jobs.submit(max_steps_per_epoch=400, max_restarts=1)
        running = jobs.wait(job_id, lambda j: j["progress"] is not None, 60, "progress")
        node = running["parts"][0]["node_name"]
        node_id = running["parts"][0]["node_id"]
        admin.post(f"/nodes/{node_id}/revoke").raise_for_status()

        # Its daemon is refused, stops what it ran, and exits 3.
        daemon = next(w for w in cluster.worker_processes if w.name == node)
        assert daemon.process.wait(30) == 3
        assert "revoked" in daemon.log_tail()
        # A restart with the same credential and join token stays out.
        again = cluster.start_worker(node)
        assert again.process.wait(60) == 3

        # The job went on, on the other node.
        done = jobs.wait_done(job_id, timeout_s=180)
        assert done["status"] == "succeeded", done["error"]
        assert done["attempts"][0]["error"]["reason"] == "node_revoked"
        assert done["parts"][0]["node_name"] != node
        states = until(
            lambda: {n["name"]: n["state"] for n in client.get("/nodes").json()["data"]},
            5,
            "the nodes",
        )
        assert states[node] == "revoked"


def test_a_server_started_without_tokens_makes_them_and_clients_here_find_them(
    tmp_path: Path,
) -> None:
    """No token set anywhere: the server makes an admin and a join token,
    keeps them beside its database (0600), and keeps them over a restart; a
    worker on this host joins and ``ddpo`` lists jobs, neither told a token."""
    runtime = tmp_path / "runtime"
    cluster = LocalCluster(
        state_dir=tmp_path / "cluster",
        data_dir=tmp_path,
        workers=1,
        server_makes_tokens=True,
        extra_env={"XDG_RUNTIME_DIR": str(runtime)},
    )
    with cluster:
        made = cluster.state_dir / "ddpo-tokens.env"
        assert stat.S_IMODE(made.stat().st_mode) == 0o600
        # The database and its WAL too, whatever the umask it was started with.
        for name in ("ddpo.db", "ddpo.db-wal"):
            assert stat.S_IMODE((cluster.state_dir / name).stat().st_mode) == 0o600, name
        assert cluster.tokens is not None
        first = cluster.tokens
        assert httpx.get(f"{cluster.url}/jobs").status_code == 401  # tokens, always
        assert cluster.server is not None and "ddpo-tokens.env" in cluster.server.log_tail()
        submitted = ddpo_told_no_token(cluster.url, runtime, "list")
        assert submitted.returncode == 0, submitted.stderr
        assert "(0 of 0)" in submitted.stdout
        # A restart: the same tokens, from the same file.
        assert cluster.server is not None
        note = runtime / "ddpo" / f"server-{cluster.port}.json"
        assert note.exists()
        cluster.server.stop()  # SIGTERM
        assert not note.exists(), "a server stopped by SIGTERM takes its note with it"
        cluster.start_server()
        assert ClusterTokens.made_by_server(made) == first
        assert httpx.get(f"{cluster.url}/jobs", headers=cluster.headers("admin")).is_success
        with cluster.client() as client:
            until(
                lambda: client.get("/nodes", params={"state": "live"}).json()["count"] == 1,
                30,
                "the worker back",
            )


def test_a_token_file_others_may_read_is_refused_not_used(tmp_path: Path) -> None:
    """A token file left mode 0666 (by hand, or a careless copy) was used and
    logged as "(mode 0600)": its tokens may be anyone's."""
    exposed = tmp_path / "ddpo-tokens.env"
    exposed.write_text("DDPO_ADMIN_TOKEN=a-token-anyone-read\nDDPO_JOIN_TOKEN=another\n")
    exposed.chmod(0o666)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DDPO_")},
        "DDPO_DATABASE_URL": f"sqlite:///{tmp_path / 'ddpo.db'}",
        "DDPO_TOKEN_FILE": str(exposed),
        "DDPO_PORT": str(free_port()),
    }
    started = subprocess.run(
        [sys.executable, "-m", "api"], env=env, capture_output=True, text=True, timeout=60
    )
    assert started.returncode == 2, started.stderr
    assert f"{exposed} is mode 0666: others on this host may read or change" in started.stderr
    assert f"chmod 600 {exposed}" in started.stderr
