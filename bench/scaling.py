"""The scaling study through the orchestrator: POST /studies on a local
server with one worker (this machine), default rows 1, 2, 4, 8 processes
with batch 128, 64, 32, 16 (the global batch stays 128), one full epoch.
Repeated ``--rounds`` times, back to back, with the mean of each row.

    python -m bench.scaling --data-dir ../shared/data --rounds 2
"""

from __future__ import annotations

import os
import statistics

from bench._runs import bench_parser, local_cluster
from cli import render
from cli.studies import run_study
from ddpo.schemas import StudyPublic


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args(argv)
    studies: list[StudyPublic] = []
    with local_cluster(args.data_dir) as (cluster, _), open(os.devnull, "w") as quiet:
        for _ in range(args.rounds):
            with cluster.api() as api:
                study = run_study(api, {"spec": {"epochs": args.epochs}}, out=quiet)
            print(render.study_table(study), flush=True)
            studies.append(study)

    print(f"\nmean of {len(studies)} round(s):")
    print(
        f"{'topology':<10} {'wall s':>7} {'train s':>8} {'samples/s':>10} {'speedup':>8} "
        f"{'test acc':>9}"
    )
    for index, row in enumerate(studies[0].rows):
        same = [s.rows[index] for s in studies]
        wall = statistics.mean(r.wall_seconds or 0 for r in same)
        train = statistics.mean(r.training_seconds or 0 for r in same)
        rate = statistics.mean(r.samples_per_sec or 0 for r in same)
        speedup = statistics.mean(r.speedup or 0 for r in same)
        accuracy = statistics.mean(r.test_accuracy or 0 for r in same)
        print(
            f"{f'{row.num_machines} x {row.num_processes}':<10} {wall:7.1f} {train:8.1f} "
            f"{rate:10,.0f} {speedup:8.2f} {100 * accuracy:8.2f}%"
        )
    one, two = (statistics.mean(s.rows[i].wall_seconds or 0 for s in studies) for i in (0, 1))
    print(f"\nwall time 1 x 2 / 1 x 1: {two / one:.3f}")


if __name__ == "__main__":
    main()
