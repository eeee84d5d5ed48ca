"""The recipe's way against ours, side by side in one invocation: the
recipe script (bench/recipe.py: mp.spawn, per-image torchvision transforms,
default threads) and the same topology and epochs as a job through the
orchestrator (a local server and one worker) with the default performance
options.

    python -m bench.recipe_vs_ours --data-dir ../shared/data --processes 1 --batch-size 128

Prints each run, both mean times and the ratio ours / recipe.
"""

from __future__ import annotations

from bench._runs import (
    alternate,
    bench_parser,
    local_cluster,
    mean_train,
    mean_wall,
    run_orchestrated,
    run_recipe,
)
from ddpo.schemas import JobSpec, Topology


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    spec = JobSpec(
        topology=Topology(num_machines=1, num_processes=args.processes),
        batch_size=args.batch_size,
        epochs=args.epochs,
    )

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
                "ours": lambda: run_orchestrated(spec, client, way="ours"),
            },
        )

    recipe, ours = mean_wall(runs, "recipe"), mean_wall(runs, "ours")
    print(
        f"\n1 machine x {args.processes} process(es), batch {args.batch_size}, "
        f"{args.epochs} epoch(s)"
    )
    print(f"mean wall time: recipe {recipe:.1f} s, ours (through the orchestrator) {ours:.1f} s")
    print(
        f"mean training loop: recipe {mean_train(runs, 'recipe'):.1f} s, "
        f"ours {mean_train(runs, 'ours'):.1f} s"
    )
    print(f"ratio ours / recipe (wall): {ours / recipe:.3f}  ({recipe / ours:.2f}x faster)")


if __name__ == "__main__":
    main()
