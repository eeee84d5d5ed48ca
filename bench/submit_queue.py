"""What a submit costs as the queue grows: a real server whose two nodes
are busy, ``POST /jobs`` timed as the queue fills to a thousand jobs (the
default cap of one person's queue) and beyond.

    python -m bench.submit_queue --queued 1500 --against 03671b0

Prints the median and slowest submit in each band of the queue's length;
``--against COMMIT`` runs that commit's server too, band for band.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench._runs import servers_to_compare
from cli.cluster import LocalCluster

BAND = 250


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--queued", type=int, default=1500)
    parser.add_argument("--against", metavar="COMMIT", help="also run that commit's server")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        servers = servers_to_compare(stack, tmp, args.against)
        clients: dict[str, httpx.Client] = {}
        for name, env in servers.items():
            cluster = stack.enter_context(
                LocalCluster(
                    state_dir=tmp / name,
                    data_dir=tmp,
                    workers=0,
                    server_env={
                        **env,
                        "DDPO_HEARTBEAT_TIMEOUT_S": "3600",
                        "DDPO_MAX_QUEUED_JOBS_PER_PERSON": str(args.queued + 10),
                    },
                )
            )
            client = stack.enter_context(
                httpx.Client(base_url=cluster.url, timeout=60, headers=cluster.headers("user"))
            )
            _fill_the_nodes(cluster, client)
            clients[name] = client
        took: dict[str, list[float]] = {name: [] for name in clients}
        for band in range(0, args.queued, BAND):
            for name, client in clients.items():
                for _ in range(BAND):  # alternating bands: the same noise for both
                    started = time.perf_counter()
                    client.post("/jobs", json={"max_steps_per_epoch": 1}).raise_for_status()
                    took[name].append(time.perf_counter() - started)
                last = took[name][-BAND:]
                print(
                    f"{name:10} queue {band:5}-{band + BAND:5}: submit median "
                    f"{1000 * statistics.median(last):6.1f} ms, slowest {1000 * max(last):6.1f} ms",
                    flush=True,
                )


def _fill_the_nodes(cluster: LocalCluster, client: httpx.Client) -> None:
    """Two nodes of one slot, each running a job: every later job queues."""
    assert cluster.tokens is not None
    for name in ("busy-a", "busy-b"):
        node = httpx.post(
            f"{cluster.url}/nodes/register",
            json={"name": name, "address": "127.0.0.1"},
            headers={"Authorization": f"Bearer {cluster.tokens.join}"},
        ).raise_for_status()
        node_id, credential = node.json()["node_id"], node.json()["credential"]
        client.post("/jobs", json={}).raise_for_status()
        as_node = {"Authorization": f"Bearer {credential}"}
        poll = {"active_part_ids": [], "waiting_for_port": [], "wait_s": 0}
        (start,) = httpx.post(
            f"{cluster.url}/nodes/{node_id}/poll", json=poll, headers=as_node
        ).json()["start"]
        httpx.post(
            f"{cluster.url}/parts/{start['part_id']}/started",
            json={"node_id": node_id},
            headers=as_node,
        ).raise_for_status()


if __name__ == "__main__":
    main()
