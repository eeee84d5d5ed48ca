"""README's "A cluster to play with, then curl", run as written: the kept
local cluster in one shell, every curl line in another. Only the data
directory is replaced (README's ../shared/data is relative to a clone)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from cli import kept
from cli.cluster import port_free
from cli.local_cluster import KEPT_PORT
from tests.conftest import REPO
from tests.e2e.conftest import until

pytestmark = pytest.mark.e2e

SECTION = "### A cluster to play with, then curl"


def shell_blocks() -> list[str]:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index(SECTION) :]
    section = section[: section.index("\n### ", len(SECTION))]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def run_block(block: str, cwd: Path, env: dict[str, str]) -> str:
    """The block in bash, stopping at the first line that fails."""
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", f"source local-cluster/tokens.env\n{block}"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{block}\nfailed with {done.returncode}:\n{done.stderr}"
    return done.stdout


def test_readmes_kept_cluster_and_curl_lines_work_as_written(
    mnist_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not port_free(KEPT_PORT):
        pytest.fail(f"README's examples need localhost:{KEPT_PORT}, which is taken here")
    setup, submit_and_read, after_the_job = shell_blocks()
    start, source = [line for line in setup.splitlines() if not line.startswith("#")]
    assert source == "source local-cluster/tokens.env"
    start = start.replace(".venv/bin/ddpo", f"{sys.executable} -m cli")
    start = start.replace("../shared/data", str(mnist_dir))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DDPO_")},
        "DDPO_CLUSTER_FILE": str(tmp_path / "cluster.json"),
        "PYTHONPATH": str(REPO),
    }
    with subprocess.Popen(
        ["bash", "-c", f"exec {start}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as keeper:
        try:
            monkeypatch.setenv("DDPO_CLUSTER_FILE", env["DDPO_CLUSTER_FILE"])
            until(lambda: kept.read() is not None, 120, "the kept cluster")
            shown = run_block(submit_and_read, tmp_path, env)
            assert '"name":"mnist-2x1"' in shown.replace(" ", "")
            found = kept.read()
            assert found is not None
            headers = {"Authorization": f"Bearer {found.token}"}
            deadline = time.monotonic() + 240
            while True:  # as a user waits for job 1 to end
                job = httpx.get(f"{found.server}/jobs/1", headers=headers, timeout=10).json()
                if job["status"] in ("succeeded", "failed", "cancelled"):
                    break
                assert time.monotonic() < deadline, f"job 1 did not end: {job}"
                time.sleep(1)
            assert job["status"] == "succeeded", job["error"]
            shown = run_block(after_the_job, tmp_path, env)
            assert "Test set: average loss" in shown
            checkpoint = torch.load(tmp_path / "model.pt", weights_only=False)
            assert "model" in checkpoint
            cancelled = httpx.get(f"{found.server}/jobs/2", headers=headers, timeout=10).json()
            assert cancelled["status"] in ("cancelled", "cancelling")
            keeper.send_signal(2)  # Ctrl-C
            assert keeper.wait(60) == 0
        finally:
            keeper.kill()
