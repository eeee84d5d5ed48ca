"""What a node's large bodies cost everyone else: a registered node sends
concurrent 16 MiB log batches while another client times ``/healthz``.

    python -m bench.node_bodies --senders 4 --rounds 3 --against 03671b0

Two kinds of body, each the size a log batch may reach (DDPO_MAX_BODY_KB):
``lines``, 10,000 lines of 1,500 characters (what a chatty job sends), and
``numbers``, eight million numbers in one array (what a hostile node sends
to make the decoder work hardest per byte). Prints, per kind, the slowest
``/healthz`` answer while the bodies were being read and how long the
batch took; ``--against COMMIT`` runs that commit's server too, round for
round, to compare how each reads them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx

from bench._runs import servers_to_compare
from cli.cluster import LocalCluster


def bodies() -> dict[str, bytes]:
    at = datetime.now(timezone.utc).isoformat()
    lines = [{"rank": 0, "offset": i * 1700, "text": "x" * 1500, "at": at} for i in range(10_000)]
    numbers = b",".join([b"0"] * (8 * 2**20 - 64))
    return {
        "lines": json.dumps({"node_id": 0, "lines": lines}).encode(),
        "numbers": b'{"node_id": 0, "lines": [], "x": [' + numbers + b"]}",
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--senders", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--against",
        metavar="COMMIT",
        help="also run that commit's server (a git worktree), alternating rounds with this one",
    )
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        servers = servers_to_compare(stack, tmp, args.against)
        nodes: dict[str, tuple[LocalCluster, tuple[int, dict[str, str]]]] = {}
        for name, env in servers.items():
            cluster = stack.enter_context(
                LocalCluster(state_dir=tmp / name, data_dir=tmp, workers=0, server_env=env)
            )
            nodes[name] = (cluster, _register(cluster))
        for kind, body in bodies().items():
            for _ in range(args.rounds):
                for name, (cluster, (node_id, auth)) in nodes.items():
                    mine = body.replace(b'"node_id": 0', f'"node_id": {node_id}'.encode())
                    slowest, took, codes = _round(cluster.url, auth, mine, args.senders)
                    print(
                        f"{name:10} {kind:8} {len(mine) / 2**20:5.1f} MiB x {args.senders}: "
                        f"slowest /healthz {1000 * slowest:6.0f} ms, "
                        f"all answered in {took:5.2f} s ({sorted(set(codes))})",
                        flush=True,
                    )


def _register(cluster: LocalCluster) -> tuple[int, dict[str, str]]:
    assert cluster.tokens is not None
    registered = httpx.post(
        f"{cluster.url}/nodes/register",
        json={"name": "chatty", "address": "127.0.0.1"},
        headers={"Authorization": f"Bearer {cluster.tokens.join}"},
    ).raise_for_status()
    node = registered.json()
    return node["node_id"], {
        "Authorization": f"Bearer {node['credential']}",
        "Content-Type": "application/json",
    }


def _round(
    url: str, auth: dict[str, str], body: bytes, senders_count: int
) -> tuple[float, float, list[int]]:
    codes: list[int] = []

    def send() -> None:
        # A part that does not exist: the body is read and checked all the
        # same, and nothing is stored (the figure is the reading alone).
        with httpx.Client(base_url=url, timeout=120) as sender:
            codes.append(sender.post("/parts/999999/logs", content=body, headers=auth).status_code)

    senders = [threading.Thread(target=send) for _ in range(senders_count)]
    started = time.perf_counter()
    for sender in senders:
        sender.start()
    slowest = 0.0
    with httpx.Client(base_url=url, timeout=60) as client:
        while any(sender.is_alive() for sender in senders):
            asked = time.perf_counter()
            client.get("/healthz").raise_for_status()
            slowest = max(slowest, time.perf_counter() - asked)
            time.sleep(0.02)
    took = time.perf_counter() - started
    return slowest, took, codes


if __name__ == "__main__":
    main()
