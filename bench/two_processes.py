"""Is 1 machine x 2 processes (batch 64) faster than 1 x 1 (batch 128) here?
The default job, one full epoch each way, alternating through one local
server and worker, so that drift in the machine's speed favours neither.

    python -m bench.two_processes --data-dir ../shared/data --rounds 4

Wall time is the job's, as the server saw it (created to finished); training
is rank 0's training loop.
"""

from __future__ import annotations

import statistics

from bench._runs import (
    Run,
    alternate,
    bench_parser,
    local_cluster,
    mean_train,
    mean_wall,
    run_orchestrated,
)
from ddpo.schemas import JobSpec, Performance, Topology


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--allreduce",
        choices=["shared_memory", "gloo"],
        default="shared_memory",
        help="how the 2 ranks average gradients (performance.same_host_allreduce)",
    )
    args = parser.parse_args(argv)
    one = JobSpec(topology=Topology(num_processes=1), batch_size=128)
    two = JobSpec(
        topology=Topology(num_processes=2),
        batch_size=64,
        performance=Performance(same_host_allreduce=args.allreduce),
    )
    with local_cluster(args.data_dir) as (_, client):
        runs = alternate(
            args.rounds,
            {
                "1 x 1": lambda: run_orchestrated(one, client, "1 x 1"),
                "1 x 2": lambda: run_orchestrated(two, client, "1 x 2"),
            },
        )

    def ratios(value: str) -> list[float]:
        firsts = [r for r in runs if r.way == "1 x 1"]
        seconds = [r for r in runs if r.way == "1 x 2"]
        return [_value(b, value) / _value(a, value) for a, b in zip(firsts, seconds, strict=True)]

    print(f"\n{'':<10} {'1 x 1':>8} {'1 x 2':>8} {'ratio':>7}   per round")
    for label, value, mean in (
        ("wall s", "wall", mean_wall),
        ("train s", "train", mean_train),
    ):
        a, b = mean(runs, "1 x 1"), mean(runs, "1 x 2")
        per_round = " ".join(f"{r:.3f}" for r in ratios(value))
        print(f"{label:<10} {a:8.2f} {b:8.2f} {b / a:7.3f}   {per_round}")
    faster = sum(r < 1 for r in ratios("wall"))
    print(f"1 x 2 faster in {faster} of {args.rounds} rounds (wall)")
    accuracy = {r.way: r.accuracy for r in runs}
    print("test accuracy: " + ", ".join(f"{w} {100 * (a or 0):.2f}%" for w, a in accuracy.items()))
    print(f"median wall ratio {statistics.median(ratios('wall')):.3f}")


def _value(run: Run, value: str) -> float:
    return run.wall_s if value == "wall" else run.train_s or 0.0


if __name__ == "__main__":
    main()
