"""Test accuracy after the default job's training (1 x 1, batch 128, one
epoch) for several seeds, run directly through the launcher: how much of a
one-epoch accuracy figure is the seed.

    python -m bench.seed_accuracy --data-dir ../shared/data --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from api.schemas import JobSpec
from bench._runs import run_direct


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data-dir", type=Path, default=Path(os.environ.get("DDPO_DATA_DIR", "./data"))
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    args = parser.parse_args(argv)
    accuracies = []
    with tempfile.TemporaryDirectory(prefix="ddpo-bench-") as tmp:
        for seed in args.seeds:
            run = run_direct(JobSpec(seed=seed), args.data_dir, Path(tmp))
            assert run.accuracy is not None
            accuracies.append(run.accuracy)
            print(
                f"seed {seed:>3}: test accuracy {100 * run.accuracy:.2f}%  "
                f"(training {run.train_s:.1f} s)",
                flush=True,
            )
    print(
        f"\nover {len(accuracies)} seeds: mean {100 * statistics.mean(accuracies):.2f}%, "
        f"min {100 * min(accuracies):.2f}%, max {100 * max(accuracies):.2f}%"
    )


if __name__ == "__main__":
    main()
