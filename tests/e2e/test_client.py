"""``ddpo.Client`` and ``ddpo.AsyncClient`` as a user's script meets them
(tests/e2e/client_script.py, in its own interpreter): a job submitted,
its log followed to the end while the server is killed and started again
(every line once, the last one too), waited for, its model downloaded and
loaded; a failing job's reason; a bad spec's field."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.cluster import LocalCluster
from tests.conftest import REPO
from tests.e2e.conftest import Jobs, until, worker_path

pytestmark = pytest.mark.e2e


@pytest.fixture
def own_server(mnist_dir: Path, tmp_path: Path) -> Iterator[LocalCluster]:
    """Two workers (one job of each client at a time) whose server this test kills."""
    with LocalCluster(
        state_dir=tmp_path / "cluster",
        data_dir=mnist_dir,
        workers=2,
        extra_env=worker_path(),
        worker_args=["--trainer", "crash=tests.e2e.trainers:CRASH"],
    ) as running:
        yield running


def every_line(jobs: Jobs, job_id: int) -> list[list[Any]]:
    """The job's whole log, paged from the server."""
    lines: list[list[Any]] = []
    since = 0
    while True:
        page = jobs.client.get(f"/jobs/{job_id}/logs", params={"since": since}).json()
        if not page["lines"]:
            return lines
        lines += [[line["id"], line["text"]] for line in page["lines"]]
        since = page["next_since"]


def test_scripts_on_both_clients_ride_out_a_restart_and_miss_no_line(
    own_server: LocalCluster, tmp_path: Path
) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("DDPO_SERVER", "DDPO_TOKEN")},
        **own_server.cli_env(),
        "PYTHONPATH": str(REPO),
    }
    scripts = {
        mode: subprocess.Popen(
            [sys.executable, str(REPO / "tests/e2e/client_script.py"), mode, str(tmp_path)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mode in ("sync", "async")
    }
    try:
        with own_server.client() as http:
            jobs = Jobs(http)
            until(lambda: http.get("/jobs").json()["count"] >= 2, 60, "both scripts' jobs")
            for job_id in (1, 2):
                # Both are training and have printed: the restart cuts their follow.
                jobs.wait(job_id, lambda j: j["progress"] is not None, 180, "training")
            until(lambda: len(every_line(jobs, 1)) and len(every_line(jobs, 2)), 60, "lines")
        assert own_server.server is not None
        own_server.server.process.send_signal(signal.SIGKILL)
        own_server.server.stop()
        down_at = time.monotonic()
        until(lambda: time.monotonic() - down_at > 3, 5, "the scripts to miss the server")
        own_server.start_server()  # same port, same database
        seen = {}
        for mode, script in scripts.items():
            out, err = script.communicate(timeout=600)
            assert script.returncode == 0, f"{mode}:\n{out}\n{err}"
            assert "retrying until it answers" in err and "the server is back" in err, err
            seen[mode] = json.loads(out.strip().splitlines()[-1])
    finally:
        for script in scripts.values():
            script.kill()
    with own_server.client() as http:
        jobs = Jobs(http)
        for mode, saw in seen.items():
            whole = every_line(jobs, saw["job"])
            assert saw["lines"] == whole, mode  # every line, once, in order, the last too
            assert any("Test set: average loss" in text for _, text in whole), whole[-3:]
            assert saw["status"] == "succeeded" and saw["listed"], (mode, saw)
            assert {"conv1.weight", "fc2.bias"} <= set(saw["model_keys"]), saw["model_keys"]
            assert saw["failed"][0] == "rank_failed", saw["failed"]
            assert "raised an exception" in saw["failed"][1], saw["failed"]
            assert "injected failure on rank 0" in saw["failed"][2], saw["failed"]
            assert saw["invalid"] == ["topology.num_machines"], saw["invalid"]
