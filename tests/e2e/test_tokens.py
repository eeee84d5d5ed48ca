"""A cluster with tokens: workers present theirs, people theirs, a job runs
end to end, and no token appears in any log or answer."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from cli.cluster import LocalCluster
from tests.e2e.conftest import Jobs

pytestmark = pytest.mark.e2e

USER = "user-token-6b1f0c9e2d"
WORKER = "worker-token-4e8a2c7f1b"


def test_a_job_runs_with_tokens_and_no_log_shows_them(mnist_dir: Path, tmp_path: Path) -> None:
    with LocalCluster(
        state_dir=tmp_path / "cluster",
        data_dir=mnist_dir,
        workers=2,
        # The server's DDPO_WORKER_TOKEN is the one it accepts; the workers'
        # (same name, their own prefix) the one they present.
        extra_env={"DDPO_WORKER_TOKEN": WORKER},
        server_env={"DDPO_USER_TOKEN": USER, "DDPO_ACCESS_LOG": "true"},
        token=USER,
    ) as cluster:
        assert httpx.get(f"{cluster.url}/jobs").status_code == 401
        with httpx.Client(
            base_url=cluster.url, timeout=30, headers={"Authorization": f"Bearer {USER}"}
        ) as client:
            jobs = Jobs(client)
            job_id = jobs.submit(machines=2, max_steps_per_epoch=5)
            job = jobs.wait_done(job_id, timeout_s=120)
            answers = [
                client.get(f"/jobs/{job_id}").text,
                client.get(f"/jobs/{job_id}/logs").text,
                client.get("/nodes").text,
            ]
        assert job["status"] == "succeeded", job["error"]
        # A worker's token does not let it act as a person.
        as_worker = httpx.post(
            f"{cluster.url}/jobs", json={}, headers={"Authorization": f"Bearer {WORKER}"}
        )
        assert as_worker.status_code == 403
    logs = {p.name: p.read_text(errors="replace") for p in cluster.state_dir.rglob("*.log")}
    assert "GET /jobs" in logs["server.log"]  # the access log was on
    for token in (USER, WORKER):
        assert [name for name, text in logs.items() if token in text] == []
        assert not any(token in text for text in answers)
