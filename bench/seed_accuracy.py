"""Test accuracy after one epoch of the default job (1 x 1, batch 128) for
several seeds, ours (our launcher, default performance options) and the
recipe's (bench/recipe.py), each seed side by side: how much of a one-epoch
accuracy figure is the seed.

    python -m bench.seed_accuracy --data-dir ../shared/data --seeds 0 1 2 3 4
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from bench._runs import bench_parser, run_direct, run_recipe
from ddpo.schemas import JobSpec


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    args = parser.parse_args(argv)
    ours: list[float] = []
    recipe: list[float] = []
    with tempfile.TemporaryDirectory(prefix="ddpo-bench-") as tmp:
        for seed in args.seeds:
            mine = run_direct(JobSpec(seed=seed), args.data_dir, Path(tmp))
            theirs = run_recipe(args.data_dir, processes=1, batch_size=128, epochs=1, seed=seed)
            assert mine.accuracy is not None and theirs.accuracy is not None
            ours.append(mine.accuracy)
            recipe.append(theirs.accuracy)
            print(
                f"seed {seed:>3}: ours {100 * mine.accuracy:.2f}%  "
                f"recipe {100 * theirs.accuracy:.2f}%",
                flush=True,
            )
    for name, values in (("ours", ours), ("recipe", recipe)):
        print(
            f"{name:<7} over {len(values)} seeds: mean {100 * statistics.mean(values):.2f}%, "
            f"min {100 * min(values):.2f}%, max {100 * max(values):.2f}%"
        )


if __name__ == "__main__":
    main()
