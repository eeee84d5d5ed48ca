"""Checkpoints in an artifact store with real workers, written and read by
the workers themselves: an S3 bucket (a real S3-compatible server,
tests/objectstore.py) and a directory every worker and server mounts
(file://). A 2 x 1 job's checkpoints land in the store, not on the
server's disk and not through it; after a rank is killed its retry resumes
on both nodes from the store's checkpoint; the final model downloaded is
the store's object. A 1 GB checkpoint from a plugin trainer passes with
the worker's and the server's memory each rising by less than 200 MB.

Named to run late in CI's main lane (pytest takes modules in name order):
its 1 GB objects keep both cores busy for a minute and a half, and CI's
PostgreSQL lane runs beside the first end-to-end modules, where its
hand-played nodes timed out once beside it."""

from __future__ import annotations

import hashlib
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from cli.cluster import LocalCluster, ManagedProcess
from ddpo import store
from ddpo.schemas import CHECKPOINT_SHA256_HEADER
from tests.e2e.conftest import Jobs, training_processes, worker_path
from tests.objectstore import S3Server

BIG_MB = 1024
# What passing a checkpoint on may add to a process's memory, at most.
MEMORY_RISE_LIMIT = 200 * 2**20


@dataclass
class Store:
    root: str
    s3: S3Server | None
    bucket: str | None = None
    directory: Path | None = None

    def objects(self) -> list[str]:
        """Every object's name under the root."""
        if self.s3 is not None:
            assert self.bucket is not None
            prefix = self.root.split(f"s3://{self.bucket}/", 1)[1]
            return [k[len(prefix) + 1 :] for k in self.s3.keys(self.bucket)]
        assert self.directory is not None
        return sorted(str(p.relative_to(self.directory)) for p in self.directory.rglob("*.pt"))


@pytest.fixture(scope="module", params=["s3", "shared-directory"])
def kept_in(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Store:
    if request.param == "s3":
        s3: S3Server = request.getfixturevalue("s3")
        bucket = s3.new_bucket()
        return Store(f"s3://{bucket}/ddpo", s3, bucket=bucket)
    shared = tmp_path_factory.mktemp("shared") / "ddpo"
    return Store(f"file://{shared}", None, directory=shared)


@pytest.fixture(scope="module")
def stored(
    mnist_dir: Path, tmp_path_factory: pytest.TempPathFactory, kept_in: Store
) -> Iterator[tuple[LocalCluster, Store]]:
    with LocalCluster(
        state_dir=tmp_path_factory.mktemp("store"),
        data_dir=mnist_dir,
        workers=2,
        server_env={
            "DDPO_ARTIFACT_STORE": kept_in.root,
            "DDPO_RETRY_BACKOFF_S": "0.5",
            "DDPO_MAX_CHECKPOINT_MB": str(2 * BIG_MB),
        },
        extra_env={**worker_path(), "DDPO_TEST_CHECKPOINT_MB": str(BIG_MB)},
        worker_args=["--trainer", "big-checkpoint=tests.e2e.trainers:BIG_CHECKPOINT"],
    ) as cluster:
        yield cluster, kept_in


def worker_logs(cluster: LocalCluster) -> str:
    return "".join(w.log_path.read_text(errors="replace") for w in cluster.worker_processes)


@pytest.mark.timeout(300)
def test_a_retry_resumes_on_both_nodes_from_the_stores_checkpoint(
    stored: tuple[LocalCluster, Store],
) -> None:
    cluster, kept_in = stored
    with cluster.client() as client:
        jobs = Jobs(client)
        job_id = jobs.submit(
            machines=2, epochs=3, max_steps_per_epoch=150, batch_size=64, max_restarts=1, seed=3
        )
        saved = jobs.wait(
            job_id,
            lambda j: (j["checkpoint"] or {}).get("epoch") == 1 and j["status"] == "running",
            180,
            "epoch 1's checkpoint",
        )
        (key,) = (k for k in kept_in.objects() if k.startswith(f"job-{job_id}/"))
        assert key.endswith("-epoch-1.pt")
        machine_1 = next(p["node_name"] for p in saved["parts"] if p["machine_id"] == 1)
        for process in training_processes(cluster)[machine_1]:
            if "worker.launcher" not in " ".join(process.cmdline()):
                process.send_signal(signal.SIGKILL)  # a rank, killed as the OOM killer does
        done = jobs.wait_done(job_id, 240)
        assert done["status"] == "succeeded", done
        assert len(done["attempts"]) == 2, done["attempts"]
        resumed_from = done["attempts"][1]["resumed_from_epoch"]
        assert resumed_from >= 1
        (final,) = (k for k in kept_in.objects() if k.startswith(f"job-{job_id}/"))
        assert final.endswith("-epoch-3.pt")
        model = client.get(f"/jobs/{job_id}/model")
        opened, _ = store.open_object(f"{kept_in.root}/{final}")
        with opened:
            assert model.content == opened.read()
        assert model.headers[CHECKPOINT_SHA256_HEADER] == hashlib.sha256(model.content).hexdigest()
    # Machine 0 wrote every checkpoint to the store itself (none went through
    # the server), and each node of the retry read it from there.
    logs = worker_logs(cluster)
    assert logs.count("written to the artifact store") >= 3, logs[-3000:]
    assert " uploaded (" not in logs
    assert "fetching it through the server" not in logs
    assert logs.count(f"of epoch {resumed_from} read from the artifact store") == 2, logs[-3000:]
    assert not list((cluster.state_dir / "artifacts").glob("job-*"))


class PeakMemory:
    """The highest resident memory of each process, sampled every 0.1 s."""

    def __init__(self, processes: dict[str, ManagedProcess]) -> None:
        self._processes = {name: psutil.Process(p.process.pid) for name, p in processes.items()}
        self.baseline = {name: p.memory_info().rss for name, p in self._processes.items()}
        self.peak = dict(self.baseline)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.1):
            for name, process in self._processes.items():
                self.peak[name] = max(self.peak[name], process.memory_info().rss)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def rise(self) -> dict[str, int]:
        return {name: self.peak[name] - self.baseline[name] for name in self.peak}


@pytest.mark.timeout(400)
def test_a_1_gb_checkpoint_passes_with_little_memory_on_the_worker_and_server(
    stored: tuple[LocalCluster, Store],
) -> None:
    cluster, kept_in = stored
    with cluster.client() as client:
        jobs = Jobs(client)
        # Every worker's daemon (either may run machine 0) and the server.
        watched = {w.name: w for w in cluster.worker_processes}
        assert cluster.server is not None
        watched["server"] = cluster.server
        with PeakMemory(watched) as memory:
            job_id = jobs.submit(trainer="big-checkpoint", epochs=1, max_restarts=0)
            jobs.wait(job_id, lambda j: j["status"] != "queued", 60, "the job to be placed")
            done = jobs.wait_done(job_id, 300)
            assert done["status"] == "succeeded", done
            # The final model served by the server, streamed from the store.
            digest = hashlib.sha256()
            with client.stream("GET", f"/jobs/{job_id}/model", timeout=300) as response:
                assert response.status_code == 200
                expected = response.headers[CHECKPOINT_SHA256_HEADER]
                for chunk in response.iter_bytes():
                    digest.update(chunk)
        assert digest.hexdigest() == expected
        size = done["checkpoint"]["size_bytes"]
        assert size > BIG_MB * 2**20
        (key,) = (k for k in kept_in.objects() if k.startswith(f"job-{job_id}/"))
        assert store.size_of(f"{kept_in.root}/{key}") == size
    rise = memory.rise()
    print(f"memory rise (MB) passing {size / 2**20:.0f} MB:", {k: v >> 20 for k, v in rise.items()})
    assert all(r < MEMORY_RISE_LIMIT for r in rise.values()), rise
    assert " uploaded (" not in worker_logs(cluster)
