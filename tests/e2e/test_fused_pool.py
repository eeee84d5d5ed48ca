"""performance.fused_pool on real workers: a worker whose machine lacks the
kernel starts compiling it in the background and its jobs run aten's ops
meanwhile, saying so; a worker that has it trains with it, saying so. (What
the kernel buys is measured in bench/, never here; that its values are
aten's, bit for bit, in tests/unit/test_fused_pool.py.)"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from cli.cluster import LocalCluster
from tests.e2e.conftest import Jobs, worker_path
from worker import fused_pool

pytestmark = pytest.mark.e2e

STATUS = "max-pool and ReLU:"


def said(client: httpx.Client, job_id: int) -> list[str]:
    lines = client.get(f"/jobs/{job_id}/logs").raise_for_status().json()["lines"]
    return [line["text"] for line in lines if line["text"].startswith(STATUS)]


def short_job(jobs: Jobs) -> int:
    job_id = jobs.submit(max_steps_per_epoch=3)
    job = jobs.wait_done(job_id, timeout_s=120)
    assert job["status"] == "succeeded", job["error"]
    return job_id


def cluster_with(extensions: Path, state_dir: Path, mnist_dir: Path) -> LocalCluster:
    return LocalCluster(
        state_dir=state_dir,
        data_dir=mnist_dir,
        workers=1,
        extra_env={**worker_path(), "DDPO_WORKER_EXTENSIONS_DIR": str(extensions)},
    )


def test_a_worker_without_the_kernel_builds_it_and_runs_atens_ops_meanwhile(
    tmp_path: Path, mnist_dir: Path
) -> None:
    extensions = tmp_path / "extensions"
    with cluster_with(extensions, tmp_path / "cluster", mnist_dir) as cluster:
        node_log = cluster.state_dir / "node-0.log"
        if fused_pool.cpu_supports():
            deadline = time.monotonic() + 60
            while "compiling the fused max-pool kernel" not in node_log.read_text():
                assert time.monotonic() < deadline, node_log.read_text()
                time.sleep(0.2)
        with cluster.client() as client:
            job_id = short_job(Jobs(client))
            if not fused_pool.library(extensions).exists():  # the build is still going
                assert said(client, job_id) == [f"{STATUS} aten's (not built in {extensions} yet)"]
    # The cluster stopped its worker, and the worker its build.
    leftover = subprocess.run(
        ["pgrep", "-f", f"worker.fused_pool {extensions}"], capture_output=True, text=True
    )
    assert leftover.stdout == ""


def test_a_worker_with_the_kernel_trains_with_it(tmp_path: Path, mnist_dir: Path) -> None:
    if not fused_pool.cpu_supports() or not fused_pool.can_compile():
        pytest.skip(
            "neither AVX-512 nor AVX2, or no compiler or ninja here: workers run aten's ops"
        )
    extensions = tmp_path / "extensions"
    subprocess.run(
        [sys.executable, "-m", "worker.fused_pool", str(extensions)], check=True, timeout=300
    )
    with (
        cluster_with(extensions, tmp_path / "cluster", mnist_dir) as cluster,
        cluster.client() as client,
    ):
        jobs = Jobs(client)
        assert said(client, short_job(jobs)) == [
            f"{STATUS} the fused {fused_pool.cpu_isa()} kernel (performance.fused_pool)"
        ]
        off = jobs.submit(max_steps_per_epoch=3, performance={"fused_pool": False})
        assert jobs.wait_done(off, timeout_s=120)["status"] == "succeeded"
        assert said(client, off) == [f"{STATUS} aten's (performance.fused_pool is off)"]
