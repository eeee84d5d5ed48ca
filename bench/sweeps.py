"""What early stopping saves: README's sweep (the built-in trainer, lr in
[0.01, 5] on a log scale, 12 trials, 2 at a time) with ASHA against the
same 12 trials run to their end (pruner none; the random sampler's seed
gives both the same 12 learning rates), on one ``local-cluster --workers
2``, in alternating order, ``--rounds`` times each.

    python -m bench.sweeps --data-dir ../shared/data --rounds 2

Slot-time is the sweep's ``slot_seconds`` (machines x seconds each trial's
attempts held their nodes, placed until ended); wall time runs from the
submit to the sweep's end. Also: steps trained, and the best trial's test
accuracy against the default spec's (lr 0.5) with the same steps.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import ddpo
from bench._runs import bench_parser
from cli import render
from cli.cluster import LocalCluster
from ddpo.schemas.sweep import SweepPublic, TrialState

SPEC = {"epochs": 3, "max_steps_per_epoch": 40, "batch_size": 64}


def request(pruner: str) -> dict[str, Any]:
    return {
        "name": f"lr, {pruner}",
        "spec": SPEC,
        "space": {"lr": {"type": "float", "low": 0.01, "high": 5, "log": True}},
        "objective": {"metric": "train_loss", "direction": "minimize"},
        "max_trials": 12,
        "max_concurrent": 2,
        "sampler": {"kind": "random", "seed": 1},
        "pruner": (
            {"kind": "asha", "reduction_factor": 3, "grace_steps": 10}
            if pruner == "asha"
            else {"kind": "none"}
        ),
    }


def one_sweep(client: ddpo.Client, pruner: str) -> tuple[SweepPublic, float]:
    started = time.monotonic()
    sweep = client.submit_sweep(request(pruner))
    done = client.wait_sweep(sweep.id, timeout_s=3600)
    return done, time.monotonic() - started


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    figures: dict[str, dict[str, list[float]]] = {
        way: {"slot": [], "wall": [], "steps": [], "pruned": [], "best_acc": []}
        for way in ("asha", "none")
    }
    with (
        tempfile.TemporaryDirectory() as state,
        LocalCluster(state_dir=Path(state), data_dir=args.data_dir, workers=2) as cluster,
        ddpo.Client(cluster.url, cluster.tokens.user if cluster.tokens else None) as client,
    ):
        default = client.wait(client.submit(**SPEC), timeout_s=600)  # also warms the workers
        assert default.result is not None
        shown: SweepPublic | None = None
        for round_ in range(args.rounds):
            order = ("asha", "none") if round_ % 2 == 0 else ("none", "asha")
            for way in order:
                sweep, wall = one_sweep(client, way)
                assert sweep.best is not None
                if way == "asha":
                    shown = sweep
                best = sweep.trials[sweep.best.number]
                seen = figures[way]
                seen["slot"].append(sweep.slot_seconds)
                seen["wall"].append(wall)
                seen["steps"].append(sum(t.step or 0 for t in sweep.trials))
                seen["pruned"].append(sweep.counts.get(TrialState.PRUNED, 0))
                seen["best_acc"].append(best.test_accuracy or 0.0)
                steps, pruned, accuracy = seen["steps"][-1], seen["pruned"][-1], best.test_accuracy
                print(
                    f"round {round_ + 1} {way:<5} slot-time {sweep.slot_seconds:6.1f} s  wall "
                    f"{wall:6.1f} s  steps {steps:5.0f}  pruned {pruned:.0f}  best lr "
                    f"{sweep.best.params['lr']:.3g} test acc {100 * (accuracy or 0):.2f}%",
                    flush=True,
                )
    if shown is not None:
        print(render.sweep_table(shown))
    mean = {way: {k: statistics.mean(v) for k, v in f.items()} for way, f in figures.items()}
    asha, none = mean["asha"], mean["none"]
    print(
        f"ASHA / run to the end: slot-time {asha['slot']:.1f} / {none['slot']:.1f} s = "
        f"{asha['slot'] / none['slot']:.2f}; wall {asha['wall']:.1f} / {none['wall']:.1f} s = "
        f"{asha['wall'] / none['wall']:.2f}; steps {asha['steps']:.0f} / {none['steps']:.0f}; "
        f"pruned {asha['pruned']:.1f} of 12"
    )
    print(
        f"best trial's test accuracy: ASHA {100 * asha['best_acc']:.2f}%, run to the end "
        f"{100 * none['best_acc']:.2f}%, the default spec (lr 0.5) "
        f"{100 * (default.result.test_accuracy or 0):.2f}%"
    )


if __name__ == "__main__":
    main()
