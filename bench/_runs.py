"""Ways to run one training, timed the same way, and alternation so that
drift in a noisy machine's speed favours none of them."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import httpx

from cli.cluster import LocalCluster
from ddpo.schemas import Assignment, JobPublic, JobSpec
from worker import runfiles


def bench_parser(doc: str | None) -> argparse.ArgumentParser:
    """The benchmarks' common flag: where MNIST is."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data-dir", type=Path, default=Path(os.environ.get("DDPO_DATA_DIR", "./data"))
    )
    return parser


@dataclass
class Run:
    way: str
    wall_s: float
    train_s: float | None
    accuracy: float | None


def run_recipe(
    data_dir: Path, *, processes: int, batch_size: int, epochs: int, seed: int = 0
) -> Run:
    """bench/recipe.py in its own process: wall time from start to exit."""
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.recipe",
            "--data-dir",
            str(data_dir),
            "--processes",
            str(processes),
            "--batch-size",
            str(batch_size),
            "--epochs",
            str(epochs),
            "--seed",
            str(seed),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - started
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return Run("recipe", wall, figures["train_seconds"], figures["test_accuracy"])


def run_direct(spec: JobSpec, data_dir: Path, work: Path) -> Run:
    """Our launcher on a launch file, no server, no daemon."""
    run_dir = work / f"direct-{time.monotonic_ns()}"
    config = runfiles.LaunchConfig(
        assignment=Assignment(
            part_id=0, job_id=0, attempt_id=0, machine_id=0, spec=spec, master_addr="127.0.0.1"
        ),
        run_dir=run_dir,
        data_dir=data_dir.resolve(),
        process_group_timeout_s=300,
        parent_pid=os.getpid(),
    )
    runfiles.write_launch(config)
    started = time.perf_counter()
    with open(run_dir / runfiles.OUTPUT, "wb") as log:
        subprocess.run(
            [sys.executable, "-m", "worker.launcher", str(run_dir)],
            stdout=log,
            stderr=subprocess.STDOUT,
            check=True,
        )
    wall = time.perf_counter() - started
    result = runfiles.read_result(run_dir)
    assert result is not None
    return Run("direct", wall, result.train_seconds, result.test_accuracy)


@contextlib.contextmanager
def local_cluster(
    data_dir: Path, secure: bool = True
) -> Iterator[tuple[LocalCluster, httpx.Client]]:
    """A server and one worker in a temporary directory, and a client of it
    (with tokens, as every local cluster has, unless ``secure`` is False)."""
    with (
        tempfile.TemporaryDirectory(prefix="ddpo-bench-") as tmp,
        LocalCluster(state_dir=Path(tmp), data_dir=data_dir, workers=1, secure=secure) as cluster,
        cluster.client() as client,
    ):
        yield cluster, client


def run_orchestrated(
    spec: JobSpec,
    client: httpx.Client,
    way: str = "orchestrated",
    watch: Callable[[int], AbstractContextManager[object]] | None = None,
) -> Run:
    """POST /jobs and wait (inside ``watch(job_id)`` if given); wall time
    from the job's created_at to finished_at."""
    job_id = client.post("/jobs", json=spec.model_dump(mode="json")).raise_for_status().json()["id"]
    with watch(job_id) if watch is not None else contextlib.nullcontext():
        job = wait_for_job(client, job_id)
    assert job.result is not None and job.timing.finished_at is not None
    wall = (job.timing.finished_at - job.timing.created_at).total_seconds()
    return Run(way, wall, job.result.train_seconds, job.result.test_accuracy)


def wait_for_job(client: httpx.Client, job_id: int) -> JobPublic:
    while True:
        # Once a second, like the dashboard: faster polling would cost the
        # training CPU that a run without a server does not pay.
        time.sleep(1.0)
        job = JobPublic.model_validate(client.get(f"/jobs/{job_id}").json())
        if job.status.is_terminal():
            break
    if job.status.value != "succeeded":
        raise RuntimeError(f"job {job_id} ended {job.status.value}: {job.error}")
    return job


def alternate(rounds: int, ways: dict[str, Callable[[], Run]]) -> list[Run]:
    """Each way once per round, the order reversed every other round."""
    runs: list[Run] = []
    names = list(ways)
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            run = ways[name]()
            runs.append(run)
            train = f"{run.train_s:6.1f}" if run.train_s is not None else "     -"
            print(
                f"round {index + 1} {run.way:<14} wall {run.wall_s:6.1f} s  training {train} s  "
                f"test accuracy {100 * (run.accuracy or 0):.2f}%",
                flush=True,
            )
    return runs


def mean_wall(runs: list[Run], way: str) -> float:
    return statistics.mean(r.wall_s for r in runs if r.way == way)


def mean_train(runs: list[Run], way: str) -> float:
    return statistics.mean(r.train_s or 0.0 for r in runs if r.way == way)


def servers_to_compare(
    stack: contextlib.ExitStack, folder: Path, against: str | None
) -> dict[str, dict[str, str]]:
    """The servers a benchmark runs, by name, each with the environment its
    process needs: this tree's ("this"), and with ``against`` that commit's
    too, checked out as a git worktree under ``folder`` (removed with
    ``stack``) and put first on its PYTHONPATH."""
    servers: dict[str, dict[str, str]] = {"this": {}}
    if against:
        tree = folder / "against"
        add = ["git", "worktree", "add", "--detach", str(tree), against]
        subprocess.run(add, check=True, capture_output=True)
        stack.callback(subprocess.run, ["git", "worktree", "remove", "--force", str(tree)])
        servers[against] = {"PYTHONPATH": str(tree)}
    return servers
