"""Checkpoints in an S3 bucket (a real S3-compatible server, tests/objectstore.py)
with real workers: a 2 x 1 job's checkpoints land in the bucket, not on the
server's disk; after a rank is killed its retry resumes from the bucket's
checkpoint; the final model downloaded equals the bucket's object."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from cli.cluster import LocalCluster
from tests.e2e.conftest import Jobs, training_processes
from tests.objectstore import S3Server


@pytest.fixture(scope="module")
def stored(
    mnist_dir: Path, tmp_path_factory: pytest.TempPathFactory, s3: S3Server
) -> Iterator[tuple[LocalCluster, str]]:
    bucket = s3.new_bucket()
    with LocalCluster(
        state_dir=tmp_path_factory.mktemp("store"),
        data_dir=mnist_dir,
        workers=2,
        server_env={
            "DDPO_ARTIFACT_STORE": f"s3://{bucket}/ddpo",
            "DDPO_RETRY_BACKOFF_S": "0.5",
        },
    ) as cluster:
        yield cluster, bucket


@pytest.mark.timeout(300)
def test_a_retry_resumes_from_the_buckets_checkpoint(
    stored: tuple[LocalCluster, str], s3: S3Server
) -> None:
    cluster, bucket = stored
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
        (key,) = s3.keys(bucket)
        assert key.startswith(f"ddpo/job-{job_id}/") and key.endswith("-epoch-1.pt")
        machine_1 = next(p["node_name"] for p in saved["parts"] if p["machine_id"] == 1)
        for process in training_processes(cluster)[machine_1]:
            if "worker.launcher" not in " ".join(process.cmdline()):
                process.send_signal(signal.SIGKILL)  # a rank, killed as the OOM killer does
        done = jobs.wait_done(job_id, 240)
        assert done["status"] == "succeeded", done
        assert len(done["attempts"]) == 2, done["attempts"]
        assert done["attempts"][1]["resumed_from_epoch"] >= 1
        (final,) = s3.keys(bucket)
        assert final.endswith("-epoch-3.pt")
        model = client.get(f"/jobs/{job_id}/model")
        with fsspec.open(f"s3://{bucket}/{final}", "rb") as obj:
            assert model.content == obj.read()
    assert not list((cluster.state_dir / "artifacts").glob("job-*"))
