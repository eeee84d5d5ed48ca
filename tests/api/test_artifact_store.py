"""Checkpoints kept in an artifact store (DDPO_ARTIFACT_STORE) rather than
on the server's disk: a real S3-compatible server (tests/objectstore.py)
and a directory, driven over HTTP by a hand-played node. Only the newest
is kept; another server on the same database, with no artifacts directory
in common, serves it; retention removes it from the store; a store that
cannot be written to is a 503 the node retries, never a 500."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from api.settings import ServerSettings
from cli.cluster import free_port
from tests.api.conftest import ProtocolNode, ThreadedServer, make_settings, wait_for
from tests.api.test_protocol import submit
from tests.api.test_retries import put_checkpoint, started, upload_checkpoint
from tests.objectstore import S3Server

SECOND_IN_DAYS = 1 / 86400


def store_settings(tmp_path: Path, store: str, **overrides: object) -> ServerSettings:
    return make_settings(
        tmp_path,
        poll_wait_s=0.5,
        artifacts_dir=tmp_path / "artifacts-1",
        artifact_store=store,
        **overrides,
    )


@pytest.fixture
def bucket(s3: S3Server) -> str:
    return s3.new_bucket()


def test_in_s3_only_the_newest_checkpoint_is_kept_and_any_server_serves_it(
    tmp_path: Path, s3: S3Server, bucket: str
) -> None:
    settings = store_settings(tmp_path, f"s3://{bucket}/team-a")
    # A second server on the same database, with a disk of its own.
    other = settings.model_copy(
        update={"port": free_port(), "artifacts_dir": tmp_path / "artifacts-2"}
    )
    with (
        ThreadedServer(settings) as first,
        ThreadedServer(other) as second,
        httpx.Client(base_url=first.url, timeout=10) as client,
        httpx.Client(base_url=second.url, timeout=10) as elsewhere,
    ):
        node = ProtocolNode(client, "a")
        job_id = submit(client, epochs=3)
        part_id = started(node)["part_id"]
        assert upload_checkpoint(node, part_id, 1, b"epoch one")
        assert upload_checkpoint(node, part_id, 2, b"epoch two " * 1000)
        (key,) = s3.keys(bucket)
        assert key.startswith(f"team-a/job-{job_id}/") and key.endswith("-epoch-2.pt")
        for server in (client, elsewhere):
            served = server.get(f"/jobs/{job_id}/model")
            assert served.status_code == 200 and served.content == b"epoch two " * 1000
            assert served.headers["content-length"] == str(len(served.content))
        view = client.get(f"/jobs/{job_id}").json()
        assert view["checkpoint"]["epoch"] == 2 and view["checkpoint"]["size_bytes"] == 10_000
    # Nothing on either server's disk but their staging folders.
    for disk in ("artifacts-1", "artifacts-2"):
        assert not list((tmp_path / disk).glob("job-*")), disk


def test_in_a_directory_store_retention_removes_the_final_model(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    settings = store_settings(
        tmp_path,
        f"file://{shared}",
        sweep_interval_s=0.1,
        retention_interval_s=0.2,
        checkpoint_retention_days=2 * SECOND_IN_DAYS,
    )
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url, timeout=10) as c:
        node = ProtocolNode(c, "a")
        job_id = submit(c)
        part_id = started(node)["part_id"]
        assert upload_checkpoint(node, part_id, 1, b"the final model")
        (kept,) = shared.glob(f"job-{job_id}/*-epoch-1.pt")
        node.finish(part_id, "succeeded", exit_code=0).raise_for_status()
        assert c.get(f"/jobs/{job_id}/model").content == b"the final model"
        gone = wait_for(
            lambda: (m := c.get(f"/jobs/{job_id}/model")).status_code == 404 and m,
            what="the final model removed",
        )
        assert "removed" in gone.json()["detail"]
        assert not kept.exists()


def test_a_store_that_cannot_be_written_is_a_503_and_the_upload_can_be_retried(
    tmp_path: Path, s3: S3Server
) -> None:
    settings = store_settings(tmp_path, "s3://no-such-bucket-for-ddpo/x")
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url, timeout=10) as c:
        node = ProtocolNode(c, "a")
        job_id = submit(c)
        part_id = started(node)["part_id"]
        refused = put_checkpoint(node, part_id, 1, b"weights")
        assert refused.status_code == 503, refused.text
        assert "artifact store" in refused.json()["detail"]
        assert c.get(f"/jobs/{job_id}").json()["checkpoint"] is None
        # The upload is not stuck as in progress: the next try is heard.
        assert put_checkpoint(node, part_id, 1, b"weights").status_code == 503


def test_a_store_url_the_server_cannot_use_stops_it_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="artifact_store"):
        store_settings(tmp_path, "shared/ddpo")
