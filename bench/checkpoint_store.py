"""Saving and restoring a checkpoint: through the API server against
through the artifact store, side by side in one run.

    python -m bench.checkpoint_store --sizes-mb 100 1024

For each size, one file of random bytes (a checkpoint as torch.save wrote
it) is saved and restored as a worker does, with the worker's own code
(worker/client.py, ddpo/store.py), against a real API server process on
this machine:

- ``server disk``: no store (the default): PUT to the server, which keeps
  it on its disk; a retry's node GETs it back.
- ``server -> S3``: a store the nodes cannot write (the fallback): PUT to
  the server, which copies it into S3; GET streams it back from S3.
- ``S3 direct``: machine 0 writes to S3 itself and the server keeps the
  record; a retry's node reads it from S3.
- ``file:// direct``: the same with a directory every node mounts.

S3 is moto's S3-compatible server on loopback (tests/objectstore.py), so
the S3 figures are of the protocol's cost (signing, multipart, one more
hop), not of a network's; the file:// store is this machine's disk. Save:
from the first byte read until the server has the checkpoint on record.
Restore: until the file is whole on the node's disk with its SHA-256
checked. Each case runs ``--repeat`` times; the median is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cli.cluster import LocalCluster
from ddpo import store
from ddpo.schemas import CheckpointStored, NodeRegistration, PartFinished
from tests import objectstore
from worker.client import ServerClient

# The tests' S3-compatible server, its endpoint and credentials in AWS_*.
s3_server = contextlib.contextmanager(objectstore.start)


class Node:
    """One hand-played node on a real server: registered, given a job's
    machine 0, ready to save and restore its checkpoints."""

    def __init__(self, cluster: LocalCluster) -> None:
        assert cluster.tokens is not None
        self.cluster = cluster
        self.client = ServerClient(cluster.url, timeout_s=600)
        registered = self.client.register(
            NodeRegistration(name="bench-node", address="127.0.0.1", trainers=["mnist"]),
            cluster.tokens.join,
        )
        self.client.credential = registered.credential
        self.node_id = registered.node_id

    def new_part(self) -> tuple[int, int, str | None]:
        """A fresh job's part on this node: (job id, part id, its store folder)."""
        with self.cluster.client() as people:
            job_id = (
                people.post(
                    "/jobs",
                    json={"topology": {"num_machines": 1, "num_processes": 1}, "epochs": 50},
                )
                .raise_for_status()
                .json()["id"]
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for assignment in self.client.poll(self.node_id, [], [], wait_s=2).start:
                if assignment.job_id != job_id:
                    continue
                assert self.client.started(assignment.part_id, self.node_id)
                return job_id, assignment.part_id, assignment.checkpoint_store
        raise RuntimeError(f"job {job_id} was not placed on the bench node")


def timed(action: Callable[[], object]) -> float:
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


def run_case(
    cluster: LocalCluster, source: Path, restored: Path, direct: bool, repeat: int
) -> tuple[float, float]:
    """Median seconds to save and to restore ``source``, ``repeat`` times."""
    node = Node(cluster)
    rounds = [one_round(cluster, node, source, restored, direct) for _ in range(repeat)]
    node.client.close()
    return statistics.median(r[0] for r in rounds), statistics.median(r[1] for r in rounds)


def one_round(
    cluster: LocalCluster, node: Node, source: Path, restored: Path, direct: bool
) -> tuple[float, float]:
    job_id, part_id, folder = node.new_part()
    if direct:
        assert folder is not None, "the server gave no store folder"

        def save() -> None:
            stored = store.put(folder, store.checkpoint_name(1, None), source)
            record = CheckpointStored(
                node_id=node.node_id,
                epoch=1,
                url=stored.url,
                size=stored.size,
                sha256=stored.sha256,
            )
            assert node.client.checkpoint_stored(part_id, record)

        save_s = timed(save)
        url, sha256 = _kept(cluster, job_id)
        restore_s = timed(lambda: store.fetch(url, restored, sha256))
    else:
        save_s = timed(lambda: node.client.upload_checkpoint(part_id, node.node_id, 1, source))
        restore_s = timed(lambda: node.client.download_checkpoint(job_id, restored))
    with cluster.client() as people:
        kept = people.get(f"/jobs/{job_id}").raise_for_status().json()["checkpoint"]
        assert kept["size_bytes"] == source.stat().st_size == restored.stat().st_size
        people.post(f"/jobs/{job_id}/cancel").raise_for_status()
    # The node frees its slot, as a worker does once the part has stopped.
    node.client.finish(part_id, PartFinished(node_id=node.node_id, status="cancelled"))
    restored.unlink()
    return save_s, restore_s


def _kept(cluster: LocalCluster, job_id: int) -> tuple[str, str | None]:
    """The kept checkpoint's URL and SHA-256, as a retry's assignment
    (``resume_object``) carries them: read from the server's database here."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(cluster.state_dir / "ddpo.db")) as db:
        row = db.execute(
            "SELECT checkpoint_file, checkpoint_sha256 FROM job WHERE id = ?", (job_id,)
        ).fetchone()
    return row[0], row[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[100, 1024])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddpo-bench-store-") as tmp:
        root = Path(tmp)
        with s3_server(root / "moto.log") as s3:
            bucket = s3.new_bucket()
            cases = {
                "server disk": (None, False),
                "server -> S3": (f"s3://{bucket}/via-server", False),
                "S3 direct": (f"s3://{bucket}/direct", True),
                "file:// direct": (f"file://{root}/shared", True),
            }
            print(
                f"{'size':>8} {'case':<16} {'save s':>8} {'MB/s':>7} {'restore s':>10} {'MB/s':>7}"
            )
            for size_mb in args.sizes_mb:
                source = root / f"checkpoint-{size_mb}.pt"
                with open(source, "wb") as out:
                    for _ in range(size_mb):
                        out.write(os.urandom(2**20))
                baseline: tuple[float, float] | None = None
                for name, (artifact_store, direct) in cases.items():
                    env = {
                        "DDPO_MAX_CHECKPOINT_MB": str(4 * size_mb),
                        # The hand-played node sends no heartbeats (a worker's
                        # thread does): not lost while the server writes to S3.
                        "DDPO_HEARTBEAT_TIMEOUT_S": "3600",
                    }
                    if artifact_store is not None:
                        env["DDPO_ARTIFACT_STORE"] = artifact_store
                    with LocalCluster(
                        state_dir=root / f"state-{size_mb}-{name.replace(' ', '_')}",
                        data_dir=root,
                        workers=0,
                        server_env=env,
                    ) as cluster:
                        save_s, restore_s = run_case(
                            cluster, source, root / "restored.pt", direct, args.repeat
                        )
                    baseline = baseline or (save_s, restore_s)
                    print(
                        f"{size_mb:>6}MB {name:<16} {save_s:>8.2f} {size_mb / save_s:>7.0f} "
                        f"{restore_s:>10.2f} {size_mb / restore_s:>7.0f}"
                        f"   (x{baseline[0] / save_s:.2f} save, "
                        f"x{baseline[1] / restore_s:.2f} restore vs server disk)",
                        flush=True,
                    )
                source.unlink()


if __name__ == "__main__":
    main()
