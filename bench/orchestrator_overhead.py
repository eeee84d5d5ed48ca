"""What the orchestrator costs: one training run through server + worker,
and the same run started directly (the launcher on its own, no server, no
daemon), alternated in one invocation so both see the same machine.

    python -m bench.orchestrator_overhead --data-dir ../shared/data --rounds 2

Prints each run and the ratio of mean wall times (orchestrated / direct).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from api.schemas import Assignment, JobPublic, JobSpec
from cli.cluster import LocalCluster, free_port
from worker import runfiles


@dataclass
class Run:
    way: str
    wall_s: float
    train_s: float | None
    accuracy: float | None


def run_direct(spec: JobSpec, data_dir: Path, work: Path) -> Run:
    run_dir = work / f"direct-{time.monotonic_ns()}"
    config = runfiles.LaunchConfig(
        assignment=Assignment(
            part_id=0,
            job_id=0,
            attempt_id=0,
            machine_id=0,
            spec=spec,
            master_addr="127.0.0.1",
            master_port=free_port(),
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


def run_orchestrated(spec: JobSpec, client: httpx.Client) -> Run:
    job_id = client.post("/jobs", json=spec.model_dump(mode="json")).raise_for_status().json()["id"]
    while True:
        # Once a second, like the dashboard: faster polling would cost the
        # training CPU that the direct run does not pay.
        time.sleep(1.0)
        job = JobPublic.model_validate(client.get(f"/jobs/{job_id}").json())
        if job.status.is_terminal():
            break
    if job.status.value != "succeeded" or job.result is None or job.timing.finished_at is None:
        raise RuntimeError(f"job {job_id} ended {job.status.value}: {job.error}")
    # The server's own clock, submit to finish: what a user waits.
    wall = (job.timing.finished_at - job.timing.created_at).total_seconds()
    return Run("orchestrated", wall, job.result.train_seconds, job.result.test_accuracy)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data-dir", type=Path, default=Path(os.environ.get("DDPO_DATA_DIR", "./data"))
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--max-steps-per-epoch", type=int, default=None)
    args = parser.parse_args(argv)
    spec = JobSpec(
        epochs=args.epochs, batch_size=args.batch_size, max_steps_per_epoch=args.max_steps_per_epoch
    )

    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="ddpo-bench-") as tmp:
        work = Path(tmp)
        with (
            LocalCluster(state_dir=work / "cluster", data_dir=args.data_dir, workers=1) as cluster,
            httpx.Client(base_url=cluster.url, timeout=30) as client,
        ):
            for round_index in range(args.rounds):
                # Alternate which goes first, so drift in the machine's speed
                # does not favour one way.
                order = (
                    ["direct", "orchestrated"]
                    if round_index % 2 == 0
                    else ["orchestrated", "direct"]
                )
                for way in order:
                    run = (
                        run_direct(spec, args.data_dir, work)
                        if way == "direct"
                        else run_orchestrated(spec, client)
                    )
                    runs.append(run)
                    print(
                        f"round {round_index + 1} {run.way:<12} wall {run.wall_s:6.1f} s  "
                        f"training {run.train_s:6.1f} s  "
                        f"test accuracy {100 * (run.accuracy or 0):.2f}%",
                        flush=True,
                    )

    def mean(way: str) -> float:
        return statistics.mean(r.wall_s for r in runs if r.way == way)

    direct, orchestrated = mean("direct"), mean("orchestrated")
    print(f"\nspec: {spec.model_dump_json()}")
    print(f"mean wall time: direct {direct:.1f} s, orchestrated {orchestrated:.1f} s")
    print(f"ratio orchestrated / direct: {orchestrated / direct:.3f}")


if __name__ == "__main__":
    main()
