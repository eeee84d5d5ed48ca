"""What a node's log batch costs the server to store: one node sends
batches of 10,000 lines (the most a batch may hold) for a running part, and
each batch's answer time is taken, the job held to its line cap as it
fills (the oldest dropped in the same transaction).

    python -m bench.log_ingest --rounds 5 --against 5608d80
    python -m bench.log_ingest --rounds 5 --against 5608d80 \\
        --postgres-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres

``--against COMMIT`` runs that commit's server too, batch for batch, each
server on a database of its own (a new one on ``--postgres-url``'s server,
else a SQLite file). Prints each batch's time and the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx

from bench._runs import servers_to_compare
from bench.control_plane import fresh_postgres
from cli.cluster import LocalCluster

LINES = 10_000


class Node:
    """A node with one running part, speaking the protocol by hand."""

    def __init__(self, cluster: LocalCluster) -> None:
        assert cluster.tokens is not None
        self.client = httpx.Client(base_url=cluster.url, timeout=300)
        registered = self.client.post(
            "/nodes/register",
            json={"name": "chatty", "address": "127.0.0.1"},
            headers={"Authorization": f"Bearer {cluster.tokens.join}"},
        )
        node = registered.raise_for_status().json()
        self.node_id = node["node_id"]
        self.headers = {"Authorization": f"Bearer {node['credential']}"}
        submitted = self.client.post(
            "/jobs", json={}, headers={"Authorization": f"Bearer {cluster.tokens.user}"}
        )
        submitted.raise_for_status()
        polled = self.client.post(
            f"/nodes/{self.node_id}/poll",
            json={"active_part_ids": [], "waiting_for_port": [], "wait_s": 0},
            headers=self.headers,
        ).raise_for_status()
        (start,) = polled.json()["start"]
        self.part_id = start["part_id"]
        self.client.post(
            f"/parts/{self.part_id}/started", json={"node_id": self.node_id}, headers=self.headers
        ).raise_for_status()
        self.sent = 0

    def send_batch(self) -> float:
        at = datetime.now(timezone.utc).isoformat()
        lines = [
            {
                "rank": 0,
                "offset": 100 * i,
                "text": f"epoch 1 batch {i}: loss 0.{i % 1000:03d}",
                "at": at,
            }
            for i in range(self.sent, self.sent + LINES)
        ]
        self.sent += LINES
        started = time.perf_counter()
        self.client.post(
            f"/parts/{self.part_id}/logs",
            json={"node_id": self.node_id, "lines": lines},
            headers=self.headers,
        ).raise_for_status()
        return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", metavar="COMMIT", help="also run that commit's server")
    parser.add_argument("--postgres-url", help="a PostgreSQL server to make databases on")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        nodes: dict[str, Node] = {}
        for name, env in servers_to_compare(stack, tmp, args.against).items():
            database = (
                stack.enter_context(fresh_postgres(args.postgres_url))
                if args.postgres_url
                else None
            )
            cluster = stack.enter_context(
                LocalCluster(
                    state_dir=tmp / name,
                    data_dir=tmp,
                    workers=0,
                    database=database,
                    # The bench times the store, not the node's rate limit.
                    server_env={**env, "DDPO_LOG_LINES_PER_SECOND_PER_NODE": "1000000"},
                )
            )
            nodes[name] = Node(cluster)
        took: dict[str, list[float]] = {name: [] for name in nodes}
        for _ in range(args.rounds):
            for name, node in nodes.items():
                took[name].append(node.send_batch())
                print(f"{name:10} {LINES:,} lines stored in {took[name][-1]:.3f} s", flush=True)
        for name, times in took.items():
            print(f"{name:10} median {statistics.median(times):.3f} s a batch of {LINES:,}")
        if args.against:
            ratio = statistics.median(took[args.against]) / statistics.median(took["this"])
            print(f"{args.against} / this: {ratio:.2f}x")


if __name__ == "__main__":
    main()
