"""What the orchestrator costs: one training run through server + worker,
and the same run started directly (the launcher on its own, no server, no
daemon), alternated in one invocation so both see the same machine.

    python -m bench.orchestrator_overhead --data-dir ../shared/data --rounds 3

Prints each run and the ratio of mean wall times (orchestrated / direct).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench._runs import (
    alternate,
    bench_parser,
    local_cluster,
    mean_wall,
    run_direct,
    run_orchestrated,
)
from ddpo.schemas import JobSpec


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-steps-per-epoch", type=int, default=None)
    args = parser.parse_args(argv)
    spec = JobSpec(epochs=args.epochs, max_steps_per_epoch=args.max_steps_per_epoch)

    with (
        tempfile.TemporaryDirectory(prefix="ddpo-bench-") as tmp,
        local_cluster(args.data_dir) as (_, client),
    ):
        runs = alternate(
            args.rounds,
            {
                "direct": lambda: run_direct(spec, args.data_dir, Path(tmp)),
                "orchestrated": lambda: run_orchestrated(spec, client),
            },
        )

    direct, orchestrated = mean_wall(runs, "direct"), mean_wall(runs, "orchestrated")
    print(f"\nspec: {spec.model_dump_json()}")
    print(f"mean wall time: direct {direct:.1f} s, orchestrated {orchestrated:.1f} s")
    print(f"ratio orchestrated / direct: {orchestrated / direct:.3f}")


if __name__ == "__main__":
    main()
