"""Checkpoints kept in an artifact store (DDPO_ARTIFACT_STORE) rather than
on the server's disk: a real S3-compatible server (tests/objectstore.py)
and a directory, driven over HTTP by a hand-played node. Only the newest
is kept; another server on the same database, with no artifacts directory
in common, serves it; retention removes it from the store; a store that
cannot be written to is a 503 the node retries, never a 500."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.settings import ServerSettings
from cli.cluster import free_port
from ddpo import store
from ddpo.schemas import CHECKPOINT_SHA256_HEADER
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


@contextlib.contextmanager
def two_servers(tmp_path: Path, root: str) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    """Two servers on one database and one store, each with a disk of its own."""
    settings = store_settings(tmp_path, root)
    other = settings.model_copy(
        update={"port": free_port(), "artifacts_dir": tmp_path / "artifacts-2"}
    )
    with (
        ThreadedServer(settings) as first,
        ThreadedServer(other) as second,
        httpx.Client(base_url=first.url, timeout=10) as client,
        httpx.Client(base_url=second.url, timeout=10) as elsewhere,
    ):
        yield client, elsewhere


@pytest.fixture
def bucket(s3: S3Server) -> str:
    return s3.new_bucket()


def test_in_s3_only_the_newest_checkpoint_is_kept_and_any_server_serves_it(
    tmp_path: Path, s3: S3Server, bucket: str
) -> None:
    with two_servers(tmp_path, f"s3://{bucket}/team-a") as (client, elsewhere):
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


def record(node: ProtocolNode, part_id: int, stored: store.Stored, **fields: Any) -> httpx.Response:
    body = {
        "node_id": node.node_id,
        "epoch": 1,
        "url": stored.url,
        "size": stored.size,
        "sha256": stored.sha256,
        **fields,
    }
    return node.client.post(f"/parts/{part_id}/checkpoint/stored", json=body)


def written(tmp_path: Path, folder: str, data: bytes, base: str = "epoch-1.pt") -> store.Stored:
    source = tmp_path / "local.pt"
    source.write_bytes(data)
    return store.put(folder, base, source)


def test_a_node_writes_its_checkpoint_to_s3_and_the_server_keeps_only_the_record(
    tmp_path: Path, s3: S3Server, bucket: str
) -> None:
    """Machine 0 writes to the store itself: no bytes through the API; the
    record carries the size and SHA-256, the download says the digest, and
    a retry's assignment points at the object to read directly."""
    root = f"s3://{bucket}/team-a"
    settings = store_settings(
        tmp_path, root, sweep_interval_s=0.1, retry_backoff_s=0.2, retry_backoff_max_s=0.2
    )
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url, timeout=10) as c:
        a = ProtocolNode(c, "a")
        job_id = submit(c, epochs=3, max_restarts=1)
        first = started(a)
        folder = first["checkpoint_store"]
        assert folder == f"{root}/job-{job_id}/"
        one = written(tmp_path, folder, b"epoch one")
        assert record(a, first["part_id"], one).raise_for_status().json()["accepted"]
        two = written(tmp_path, folder, b"epoch two" * 1000, "epoch-2.pt")
        assert record(a, first["part_id"], two, epoch=2).json()["accepted"]
        # Only the newest object is left in the bucket.
        assert s3.keys(bucket) == [two.url.split(f"s3://{bucket}/", 1)[1]]
        served = c.get(f"/jobs/{job_id}/model")
        assert served.content == b"epoch two" * 1000
        assert served.headers[CHECKPOINT_SHA256_HEADER] == two.sha256
        view = c.get(f"/jobs/{job_id}").json()["checkpoint"]
        assert (view["epoch"], view["size_bytes"]) == (2, two.size)
        # A resent record of the kept one is harmless; the object stays.
        record(a, first["part_id"], two, epoch=2).raise_for_status()
        assert store.size_of(two.url) == two.size
        a.finish(first["part_id"], "failed", exit_code=-9, reason="rank_exited").raise_for_status()
        retry = started(a, active=[])
        assert retry["resume_epoch"] == 2
        assert retry["resume_object"] == {"url": two.url, "size": two.size, "sha256": two.sha256}
        # The stale attempt's record is refused, its object removed.
        stale = written(tmp_path, folder, b"stale", "epoch-3.pt")
        assert not record(a, first["part_id"], stale, epoch=3).json()["accepted"]
        with pytest.raises(FileNotFoundError):
            store.size_of(stale.url)
    assert not list((tmp_path / "artifacts-1").glob("job-*"))


def test_what_a_node_says_it_stored_is_checked_not_trusted(
    tmp_path: Path, s3: S3Server, bucket: str
) -> None:
    root = f"s3://{bucket}/team-a"
    settings = store_settings(tmp_path, root, max_checkpoint_mb=1)
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url, timeout=10) as c:
        a, other = ProtocolNode(c, "a"), ProtocolNode(c, "other")
        job_id = submit(c)
        part_id = started(a)["part_id"]
        folder = store.job_folder(root, job_id)
        real = written(tmp_path, folder, b"weights")

        def refused(status: int, says: str, stored: store.Stored, **fields: Any) -> None:
            answer = record(a, part_id, stored, **fields)
            assert answer.status_code == status, answer.text
            assert says in str(answer.json()["detail"]), answer.text

        # Another job's folder, a path that climbs out, a name put never gives.
        elsewhere = written(tmp_path, store.job_folder(root, job_id + 1), b"theirs")
        refused(409, "url: ", elsewhere)
        refused(409, "url: ", real, url=f"{folder}../job-{job_id + 1}/{elsewhere.url[-23:]}")
        refused(409, "url: ", real, url=f"{folder}epoch-1.pt")
        # Nothing there, or not the bytes said (not kept, and removed).
        refused(409, "no object", real, url=f"{folder}0123456789ab-epoch-1.pt")
        refused(409, "size: ", real, size=real.size + 1)
        with pytest.raises(FileNotFoundError):
            store.size_of(real.url)
        # The kept checkpoint, named with a wrong size: refused, not removed.
        kept = written(tmp_path, folder, b"kept weights")
        assert record(a, part_id, kept).json()["accepted"]
        refused(409, "size: ", kept, size=kept.size + 1)
        assert store.size_of(kept.url) == kept.size
        assert c.get(f"/jobs/{job_id}/model").content == b"kept weights"
        # The caps apply as to an upload.
        refused(413, "size: ", real, size=2 * 2**20)
        refused(422, "sha256", real, sha256="not-hex")
        # Not this node's part.
        answer = record(other, part_id, real, node_id=other.node_id)
        assert answer.status_code == 403, answer.text
        # The other job's object was never touched.
        assert store.size_of(elsewhere.url) == elsewhere.size


def test_without_a_store_a_record_is_refused_and_uploads_carry_their_digest(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path, poll_wait_s=0.5, artifacts_dir=tmp_path / "artifacts")
    with ThreadedServer(settings) as server, httpx.Client(base_url=server.url, timeout=10) as c:
        node = ProtocolNode(c, "a")
        job_id = submit(c)
        assignment = started(node)
        assert assignment["checkpoint_store"] is None
        fake = store.Stored("file:///tmp/x/job-1/0123456789ab-epoch-1.pt", 3, "0" * 64)
        answer = record(node, assignment["part_id"], fake)
        assert answer.status_code == 409 and "PUT /parts/" in answer.json()["detail"]
        assert upload_checkpoint(node, assignment["part_id"], 1, b"weights")
        served = c.get(f"/jobs/{job_id}/model")
        assert served.headers[CHECKPOINT_SHA256_HEADER] == hashlib.sha256(b"weights").hexdigest()


@pytest.mark.parametrize("kind", ["s3", "shared-directory"])
def test_two_servers_with_no_disk_in_common_serve_what_a_node_wrote(
    tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    """The store is all they share (and the database): either serves the
    checkpoint machine 0 wrote, with its digest."""
    if kind == "s3":
        root = f"s3://{request.getfixturevalue('bucket')}/team-a"
    else:
        root = f"file://{tmp_path / 'shared'}"
    with two_servers(tmp_path, root) as (client, elsewhere):
        node = ProtocolNode(client, "a")
        job_id = submit(client, epochs=3)
        assignment = started(node)
        stored = written(tmp_path, assignment["checkpoint_store"], b"weights " * 5000)
        assert record(node, assignment["part_id"], stored).json()["accepted"]
        for server in (client, elsewhere):
            served = server.get(f"/jobs/{job_id}/model")
            assert served.content == b"weights " * 5000
            assert served.headers[CHECKPOINT_SHA256_HEADER] == stored.sha256
    for disk in ("artifacts-1", "artifacts-2"):
        assert not list((tmp_path / disk).glob("job-*")), disk
