"""A real server (uvicorn, in its own process, on a free loopback port) and
real worker daemons, shared by the end-to-end tests; always torn down."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil
import pytest

from cli.cluster import LocalCluster
from tests.conftest import REPO
from tests.e2e.browser import page  # noqa: F401 (a fixture for every end-to-end test)

# (pytestmark in a conftest marks nothing: the hook below marks every test here.)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/e2e starts real servers and workers: ``-m "not
    e2e"`` (the quick lane) leaves them all out."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.e2e)


T = TypeVar("T")

# Small enough to keep the suite quick, long enough for several progress reports.
SMOKE_STEPS = 20


EXAMPLES = REPO / "examples"
# The scripts the tests run besides the example's.
TEST_SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture(scope="session")
def example_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example trainer package (examples/charlm), pip-installed into a
    directory of its own, as a third party's package would be: workers that
    have it on their path offer its trainer through the entry point."""
    site = tmp_path_factory.mktemp("site-packages")
    # Built from a copy: setuptools writes build/ next to the sources.
    source = tmp_path_factory.mktemp("source") / "charlm"
    shutil.copytree(
        EXAMPLES / "charlm", source, ignore=shutil.ignore_patterns("build", "*.egg-info")
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(source),
        ],
        check=True,
        timeout=180,
    )
    return site


@pytest.fixture(scope="session")
def script_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A worker's --script-dir: the example's scripts, byte for byte, and the
    tests' own under tests/."""
    directory = tmp_path_factory.mktemp("scripts")
    for script in (EXAMPLES / "scripts").glob("*.py"):
        shutil.copyfile(script, directory / script.name)
    (directory / "tests").mkdir()
    for script in TEST_SCRIPTS.glob("*.py"):
        shutil.copyfile(script, directory / "tests" / script.name)
    return directory


def worker_path(*extra: Path) -> dict[str, str]:
    """The environment that puts this checkout (and ``extra``) on a worker's path."""
    return {"PYTHONPATH": os.pathsep.join(str(p) for p in (REPO, *extra))}


@pytest.fixture(scope="session")
def cluster(
    mnist_dir: Path, tmp_path_factory: pytest.TempPathFactory, example_site: Path, script_dir: Path
) -> Iterator[LocalCluster]:
    """Two single-slot worker nodes that also offer the tests' crash trainer,
    the example trainer package and the scripts of ``script_dir``."""
    with LocalCluster(
        state_dir=tmp_path_factory.mktemp("cluster"),
        data_dir=mnist_dir,
        workers=2,
        extra_env=worker_path(example_site),
        worker_args=[
            "--script-dir",
            str(script_dir),
            "--trainer",
            "crash=tests.e2e.trainers:CRASH",
            "--trainer",
            "crash-then-linger=tests.e2e.trainers:CRASH_THEN_LINGER",
            "--trainer",
            "dies=tests.e2e.trainers:DIES",
            "--trainer",
            "mnist-no-dropout=tests.e2e.trainers:NO_DROPOUT",
            "--trainer",
            "killed-once=tests.e2e.trainers:KILLED_ONCE",
        ],
    ) as running:
        yield running


class Jobs:
    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    def submit(self, machines: int = 1, processes: int = 1, **spec: Any) -> int:
        body = {"topology": {"num_machines": machines, "num_processes": processes}, **spec}
        response = self.client.post("/jobs", json=body)
        assert response.status_code == 201, response.text
        job_id: int = response.json()["id"]
        return job_id

    def get(self, job_id: int) -> dict[str, Any]:
        job: dict[str, Any] = self.client.get(f"/jobs/{job_id}").raise_for_status().json()
        return job

    def wait(
        self, job_id: int, until: Callable[[dict[str, Any]], bool], timeout_s: float, what: str
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.get(job_id)
            if until(job):
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id}: timed out waiting for {what}; last: {job}")
            time.sleep(0.2)

    def wait_done(self, job_id: int, timeout_s: float = 180) -> dict[str, Any]:
        return self.wait(
            job_id,
            lambda j: j["status"] in ("succeeded", "failed", "cancelled"),
            timeout_s,
            "the job to end",
        )


@pytest.fixture
def jobs(cluster: LocalCluster) -> Iterator[Jobs]:
    with cluster.client() as client:
        yield Jobs(client)
    # Leave the nodes idle for the next test whatever happened in this one
    # (as an admin: a job a test submitted with a person's key is theirs).
    with cluster.client("admin") as client:
        for job in client.get("/jobs", params={"limit": 500}).json()["data"]:
            if job["status"] in ("queued", "running"):
                client.post(f"/jobs/{job['id']}/cancel")
        deadline = time.monotonic() + 30
        while (
            any(n["parts"] for n in client.get("/nodes").json()["data"])
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)


def rank_processes(cluster: LocalCluster) -> list[psutil.Process]:
    """Every process below the worker daemons but their fork servers (which
    outlive jobs by design): launchers and their ranks."""
    return [p for below in training_processes(cluster).values() for p in below]


def training_processes(cluster: LocalCluster) -> dict[str, list[psutil.Process]]:
    """Per node: the launchers and ranks below its daemon (not its fork server)."""
    found: dict[str, list[psutil.Process]] = {}
    for worker in cluster.worker_processes:
        if worker.process.poll() is not None:
            continue
        below: list[psutil.Process] = []
        for child in psutil.Process(worker.process.pid).children():
            if is_fork_server(child):
                below += child.children(recursive=True)
            else:
                below += [child, *child.children(recursive=True)]
        found[worker.name] = below
    return found


def is_fork_server(process: psutil.Process) -> bool:
    return "worker.forkserver" in process.cmdline()


def fork_server(cluster: LocalCluster, node_name: str) -> psutil.Process | None:
    worker = next(w for w in cluster.worker_processes if w.name == node_name)
    servers = [c for c in psutil.Process(worker.process.pid).children() if is_fork_server(c)]
    return servers[0] if servers else None


def still_running(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those not yet exited (a zombie has exited; reaping it is init's job)."""
    running = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                running.append(process)
        except psutil.NoSuchProcess:
            pass
    return running


def record(test: str, **figures: Any) -> None:
    folder = REPO / "test-artifacts"
    folder.mkdir(exist_ok=True)
    with open(folder / "reliability.jsonl", "a", encoding="utf-8") as out:
        out.write(json.dumps({"test": test, **figures}) + "\n")


def until(check: Callable[[], T], timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def ddpo_told_no_token(url: str, runtime: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``ddpo --server url ARGS`` with no token in its environment and no kept
    cluster: what it finds, it finds through the runtime directory."""
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("DDPO_TOKEN", "DDPO_SERVER")},
        "XDG_RUNTIME_DIR": str(runtime),
        "DDPO_CLUSTER_FILE": str(runtime / "no-kept-cluster.json"),
    }
    return subprocess.run(
        [sys.executable, "-m", "cli", "--server", url, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
