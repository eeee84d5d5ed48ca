"""The scaling study across hosts: the server and two workers each on a test
host of its own (cli/hosts.py: network namespaces on one bridge), every
worker link limited with tc tbf, and one POST /studies whose rows vary
machines as well as processes: 1 x 1, 1 x 2, 2 x 1, 2 x 2 at a LAN-like rate;
then 2 x 1 again on a slow link. One full epoch each, global batch 128.

    python -m bench.multihost --data-dir ../shared/data

Needs root (namespaces). The two worker hosts share this machine's cores,
so each declares its share (--cpus); what limits each row is in
BENCHMARKS.md.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from bench._runs import bench_parser
from cli import render
from cli.cluster import LocalCluster
from cli.hosts import TestHosts
from cli.studies import run_study
from ddpo.schemas import StudyPublic, StudyRowPublic
from worker.mnist import Net

WORKER_HOSTS = ("node-0", "node-1")
TRAIN_IMAGES = 60_000
GLOBAL_BATCH = 128
LAN_ROWS = [(1, 1, 128), (1, 2, 64), (2, 1, 64), (2, 2, 32)]


def study(
    hosts: TestHosts,
    cluster: LocalCluster,
    mbit: float,
    rows: list[tuple[int, int, int]],
    epochs: int,
) -> tuple[StudyPublic, dict[str, tuple[int, int]]]:
    """Run the rows as one study at this link rate; the bytes each worker
    host moved (received, sent) over the whole study."""
    for name in WORKER_HOSTS:
        hosts.limit_rate(name, mbit)
    before = {name: hosts.bytes_moved(name) for name in WORKER_HOSTS}
    request = {
        "name": f"across hosts at {mbit:g} Mbit/s",
        "spec": {"epochs": epochs},
        "rows": [{"num_machines": m, "num_processes": p, "batch_size": b} for m, p, b in rows],
    }
    with cluster.api() as api, open(os.devnull, "w") as quiet:
        result = run_study(api, request, out=quiet)
    after = {name: hosts.bytes_moved(name) for name in WORKER_HOSTS}
    moved = {
        name: (after[name][0] - before[name][0], after[name][1] - before[name][1])
        for name in WORKER_HOSTS
    }
    print(render.study_table(result), flush=True)
    if result.status.value != "succeeded":
        raise SystemExit(f"the study at {mbit:g} Mbit/s ended {result.status.value}")
    return result, moved


def ms_per_step(row: StudyRowPublic, epochs: int) -> float:
    steps = epochs * -(-TRAIN_IMAGES // GLOBAL_BATCH)
    return 1000 * (row.training_seconds or 0.0) / steps


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lan-mbit", type=float, default=1000.0, help="the LAN-like rate")
    parser.add_argument("--slow-mbit", type=float, default=100.0, help="the slow link's rate")
    args = parser.parse_args(argv)
    gradient_mb = sum(p.numel() * p.element_size() for p in Net().parameters()) / 1e6
    with (
        tempfile.TemporaryDirectory(prefix="ddpo-multihost-") as tmp,
        TestHosts(["server", *WORKER_HOSTS]) as hosts,
        LocalCluster(
            state_dir=Path(tmp), data_dir=args.data_dir, workers=len(WORKER_HOSTS), hosts=hosts
        ) as cluster,
    ):
        lan, _ = study(hosts, cluster, args.lan_mbit, LAN_ROWS, args.epochs)
        slow, slow_moved = study(hosts, cluster, args.slow_mbit, [(2, 1, 64)], args.epochs)

    rows = [(args.lan_mbit, row) for row in lan.rows] + [(args.slow_mbit, slow.rows[0])]
    first = rows[0][1]
    print(
        f"\n{'topology':<9} {'link':>10} {'threads':>7} {'wall s':>7} {'train s':>8} "
        f"{'ms/step':>8} {'train / 1x1':>11} {'test acc':>9}"
    )
    for mbit, row in rows:
        ratio = (row.training_seconds or 0) / (first.training_seconds or 1)
        print(
            f"{f'{row.num_machines} x {row.num_processes}':<9} {f'{mbit:g} Mbit/s':>10} "
            f"{row.threads_per_process or 0:>7} {row.wall_seconds or 0:7.1f} "
            f"{row.training_seconds or 0:8.1f} {ms_per_step(row, args.epochs):8.1f} "
            f"{ratio:11.2f} {100 * (row.test_accuracy or 0):8.2f}%"
        )
    one_host = ms_per_step(lan.rows[1], args.epochs)  # 1 x 2: shared memory
    for mbit, row in ((args.lan_mbit, lan.rows[2]), (args.slow_mbit, slow.rows[0])):
        # Ring all-reduce over 2 ranks: each sends and receives the gradients
        # once a step, both directions at once (each has its own tbf).
        wire_ms = 1000 * gradient_mb * 8 / mbit
        print(
            f"2 x 1 at {mbit:g} Mbit/s: {ms_per_step(row, args.epochs) - one_host:+.1f} ms a step "
            f"against 1 x 2's shared-memory path; {gradient_mb:.2f} MB of gradients a step, "
            f"{wire_ms:.1f} ms on the wire at this rate"
        )
    steps = args.epochs * -(-TRAIN_IMAGES // GLOBAL_BATCH)
    sent = slow_moved["node-0"][1] + slow_moved["node-1"][1]
    print(f"sent by the two hosts at {args.slow_mbit:g} Mbit/s: {sent / steps / 1e6:.2f} MB a step")


if __name__ == "__main__":
    main()
