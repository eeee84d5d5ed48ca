"""Workers that share a host divide its cores: two 1 x 1 jobs at once on
``ddpo local-cluster --workers 2`` against one such job alone on the same
share of cores, on a cluster that divides them (the default: each worker
its share, ``--cpus``, and a disjoint ``--cpu-set``) and on one whose
workers each take every core (as before); then README's study rows 1 x 1
and 2 x 1 on the dividing cluster, compared per sample.

    python -m bench.shared_cores --data-dir ../shared/data --steps 200 --rounds 2

Training time is rank 0's training loop (the job's ``timing``), the same
for every run; each figure is the mean over ``--rounds``.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import ddpo
from bench._runs import bench_parser
from cli.cluster import LocalCluster
from ddpo.schemas import JobPublic


def run_jobs(client: ddpo.Client, count: int, steps: int) -> list[JobPublic]:
    """``count`` 1 x 1 jobs submitted together, each waited for."""
    submitted = [
        client.submit(name=f"cores-{i}", max_steps_per_epoch=steps, num_machines=1, num_processes=1)
        for i in range(count)
    ]
    return [client.wait(job, timeout_s=1800) for job in submitted]


def training_s(job: JobPublic) -> float:
    assert job.timing.training_seconds is not None
    return job.timing.training_seconds


def threads(job: JobPublic) -> int | None:
    return job.timing.threads_per_process


def one_cluster(data_dir: Path, divide: bool, steps: int, rounds: int) -> dict[str, float]:
    with (
        tempfile.TemporaryDirectory() as state,
        LocalCluster(
            state_dir=Path(state), data_dir=data_dir, workers=2, divide_cores=divide
        ) as cluster,
        ddpo.Client(cluster.url, cluster.tokens.user if cluster.tokens else None) as client,
    ):
        run_jobs(client, 1, 20)  # warm: the dataset and the fork servers
        alone, together, shown_threads = [], [], set()
        for _ in range(rounds):
            (solo,) = run_jobs(client, 1, steps)
            pair = run_jobs(client, 2, steps)
            alone.append(training_s(solo))
            together.append(statistics.mean(training_s(j) for j in pair))
            shown_threads |= {threads(j) for j in (solo, *pair)}
        figures = {"alone_s": statistics.mean(alone), "together_s": statistics.mean(together)}
        print(
            f"{'divided' if divide else 'every core each':<16} threads/rank {sorted(shown_threads)}"
            f"  alone {figures['alone_s']:6.1f} s  two at once {figures['together_s']:6.1f} s"
            f"  ratio {figures['together_s'] / figures['alone_s']:.2f}",
            flush=True,
        )
        return figures


def study_rows(data_dir: Path, steps: int, rounds: int) -> None:
    """README's rows 1x1:128 and 2x1:64, per sample, on a dividing cluster."""
    rates: dict[str, list[float]] = {"1 x 1": [], "2 x 1": []}
    with (
        tempfile.TemporaryDirectory() as state,
        LocalCluster(state_dir=Path(state), data_dir=data_dir, workers=2) as cluster,
        ddpo.Client(cluster.url, cluster.tokens.user if cluster.tokens else None) as client,
    ):
        request = {
            "spec": {"max_steps_per_epoch": steps},
            "rows": [
                {"num_machines": 1, "num_processes": 1, "batch_size": 128},
                {"num_machines": 2, "num_processes": 1, "batch_size": 64},
            ],
        }
        for _ in range(rounds):
            study = client.submit_study(request)
            for row in study.rows:
                client.wait(row.job_id, timeout_s=1800)
            study = client.study(study.id)
            for row in study.rows:
                assert row.samples_per_sec is not None
                rates[f"{row.num_machines} x {row.num_processes}"].append(row.samples_per_sec)
    one, two = (statistics.mean(rates[k]) for k in ("1 x 1", "2 x 1"))
    print(
        f"study 1 x 1:128 {one:8,.0f} samples/s   2 x 1:64 {two:8,.0f} samples/s   "
        f"2 x 1 / 1 x 1 per sample: {two / one:.2f}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--steps", type=int, default=200, help="steps per job")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--divided-only",
        action="store_true",
        help="leave out the cluster whose workers each take every core (minutes) and the study",
    )
    args = parser.parse_args(argv)
    divided = one_cluster(args.data_dir, True, args.steps, args.rounds)
    if args.divided_only:
        return
    shared = one_cluster(args.data_dir, False, args.steps, args.rounds)
    print(
        f"two at once, divided vs every core each: {divided['together_s']:.1f} s vs "
        f"{shared['together_s']:.1f} s ({shared['together_s'] / divided['together_s']:.2f} x)"
    )
    study_rows(args.data_dir, args.steps, args.rounds)


if __name__ == "__main__":
    main()
