"""The recipe's way against ours, side by side in one invocation: the
recipe script (bench/recipe.py: mp.spawn, per-image torchvision transforms,
default threads) and the same topology and epochs as a job through the
orchestrator (a local server and one worker) with the default performance
options.

    python -m bench.recipe_vs_ours --data-dir ../shared/data --processes 1 --batch-size 128

Prints each run, both mean times and the ratio ours / recipe. With
``--precisions fp32 bf16-mixed`` ours also runs in bf16-mixed, alternating
with the others, and the training loops' ratio is printed.
"""

from __future__ import annotations

import functools
import os
import statistics

import torch

from bench._runs import (
    alternate,
    bench_parser,
    local_cluster,
    mean_train,
    mean_wall,
    run_orchestrated,
    run_recipe,
)
from bench.floor import epoch_floor_s
from ddpo.schemas import JobSpec, Topology


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--precisions",
        nargs="+",
        default=["fp32"],
        choices=["fp32", "bf16-mixed"],
        help="ours in each performance.precision (fp32 is the default job)",
    )
    args = parser.parse_args(argv)

    def spec(precision: str) -> JobSpec:
        return JobSpec(
            topology=Topology(num_machines=1, num_processes=args.processes),
            batch_size=args.batch_size,
            epochs=args.epochs,
            performance={"precision": precision},
        )

    def ours(precision: str) -> str:
        return "ours" if precision == "fp32" else f"ours {precision}"

    with local_cluster(args.data_dir) as (_, client):
        runs = alternate(
            args.rounds,
            {
                "recipe": lambda: run_recipe(
                    args.data_dir,
                    processes=args.processes,
                    batch_size=args.batch_size,
                    epochs=args.epochs,
                ),
                **{
                    ours(precision): functools.partial(
                        run_orchestrated, spec(precision), client, way=ours(precision)
                    )
                    for precision in args.precisions
                },
            },
        )

    recipe = mean_wall(runs, "recipe")
    print(
        f"\n1 machine x {args.processes} process(es), batch {args.batch_size}, "
        f"{args.epochs} epoch(s)"
    )
    for precision in args.precisions:
        way = ours(precision)
        wall = mean_wall(runs, way)
        accuracy = statistics.mean(run.accuracy or 0 for run in runs if run.way == way)
        print(
            f"{way}: mean wall {wall:.1f} s against the recipe's {recipe:.1f} s: "
            f"ratio {wall / recipe:.3f} ({recipe / wall:.2f}x faster); training loop "
            f"{mean_train(runs, way):.1f} s against {mean_train(runs, 'recipe'):.1f} s; "
            f"test accuracy {100 * accuracy:.2f}%"
        )
    # The floor, measured in this run: the model's FLOPs over this machine's
    # sustained matmul rate, on the threads each rank gets (bench/floor.py).
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.processes))
    floor, rate, _ = epoch_floor_s(args.batch_size, args.processes)
    per_epoch = {p: mean_train(runs, ours(p)) / args.epochs for p in args.precisions}
    print(
        f"floor of an epoch's training loop: {floor:.2f} s ({rate / 1e9:.0f} GFLOP/s fp32 on "
        f"{torch.get_num_threads()} thread(s)); "
        + ", ".join(f"{p} at {per_epoch[p] / floor:.2f}x it" for p in args.precisions)
    )
    if "fp32" in args.precisions:
        for precision in args.precisions:
            if precision != "fp32":
                gain = mean_train(runs, "ours") / mean_train(runs, ours(precision))
                print(f"training loop, fp32 / {precision}: {gain:.2f}x")


if __name__ == "__main__":
    main()
