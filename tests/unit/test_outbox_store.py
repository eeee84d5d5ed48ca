"""Machine 0's outbox with an artifact store (worker/outbox.py): a
checkpoint is written to the store once and its record sent until the
server has heard it; a write cut part-way goes on from its last part (and
a read from its last range) through a proxy that cuts the connections; a
store this node cannot write to sends it through the server instead, from
then on."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpo import store
from ddpo.schemas import Assignment, CheckpointStored, JobSpec
from tests.objectstore import S3Server
from tests.tcpproxy import CuttingProxy
from worker import runfiles
from worker.client import ServerUnavailable
from worker.courier import Courier
from worker.outbox import MAX_CUTS, Outbox


class Server:
    """What the outbox sends, as a worker's ServerClient would send it."""

    def __init__(self) -> None:
        self.records: list[CheckpointStored] = []
        self.uploads: list[tuple[int, bytes]] = []
        self.down = 0  # calls still to fail as unreachable

    def _reach(self) -> None:
        if self.down:
            self.down -= 1
            raise ServerUnavailable("connection refused")

    def checkpoint_stored(self, part_id: int, record: CheckpointStored) -> bool:
        self._reach()
        self.records.append(record)
        return True

    def upload_checkpoint(
        self, part_id: int, node_id: int, epoch: int, path: Path, step: int | None = None
    ) -> bool:
        self._reach()
        self.uploads.append((epoch, path.read_bytes()))
        return True


def outbox(tmp_path: Path, checkpoint_store: str | None) -> tuple[Outbox, Courier, Server]:
    assignment = Assignment(
        part_id=5,
        job_id=7,
        attempt_id=1,
        machine_id=0,
        spec=JobSpec(epochs=3),
        master_addr="127.0.0.1",
        checkpoint_store=checkpoint_store,
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    server = Server()
    courier = Courier(server)  # type: ignore[arg-type]
    courier.unavailable = lambda exc: None  # type: ignore[method-assign]  # no backoff here
    return Outbox(assignment, run_dir), courier, server


def save(run_dir: Path, epoch: int, data: bytes) -> None:
    runfiles.checkpoint_path(run_dir, epoch).write_bytes(data)


def test_a_checkpoint_is_written_once_and_its_record_resent_until_heard(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    box, courier, server = outbox(tmp_path, store.job_folder(f"file://{shared}", 7))
    save(box.run_dir, 1, b"epoch one")
    server.down = 2
    assert not box._upload_checkpoint(courier, node_id=3)
    assert not box._upload_checkpoint(courier, node_id=3)
    assert box._upload_checkpoint(courier, node_id=3)
    (record,) = server.records
    # Written once, whatever the retries of its record.
    (written,) = (shared / "job-7").iterdir()
    assert record.url == f"file://{written}" and written.name.endswith("-epoch-1.pt")
    assert (record.node_id, record.epoch, record.step, record.size) == (3, 1, None, 9)
    assert record.sha256 == hashlib.sha256(b"epoch one").hexdigest()
    assert server.uploads == []
    # Nothing new: nothing sent; a newer one: written and recorded.
    assert box._upload_checkpoint(courier, node_id=3) and len(server.records) == 1
    save(box.run_dir, 2, b"epoch two")
    assert box._upload_checkpoint(courier, node_id=3)
    assert [r.epoch for r in server.records] == [1, 2]


def test_a_store_this_node_cannot_write_sends_checkpoints_through_the_server(
    tmp_path: Path,
) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the store's directory should be")
    box, courier, server = outbox(tmp_path, store.job_folder(f"file://{blocked}", 7))
    save(box.run_dir, 1, b"epoch one")
    assert box._upload_checkpoint(courier, node_id=3)
    save(box.run_dir, 2, b"epoch two")
    assert box._upload_checkpoint(courier, node_id=3)
    assert server.uploads == [(1, b"epoch one"), (2, b"epoch two")]
    assert server.records == []


@pytest.fixture
def cutting_s3(s3: S3Server) -> Iterator[CuttingProxy]:
    """The S3 server behind a proxy that can cut connections: s3fs's
    clients (cached per process) made afresh to reach it, and again after.
    botocore tries each request twice, not five times: a try while the
    proxy is down takes a second, not six (what is tested is ours)."""
    import s3fs

    proxy = CuttingProxy(int(s3.url.rsplit(":", 1)[1]))
    s3fs.S3FileSystem.clear_instance_cache()
    os.environ.update(AWS_ENDPOINT_URL=proxy.url, AWS_MAX_ATTEMPTS="2")
    try:
        yield proxy
    finally:
        os.environ["AWS_ENDPOINT_URL"] = s3.url
        del os.environ["AWS_MAX_ATTEMPTS"]
        s3fs.S3FileSystem.clear_instance_cache()
        proxy.close()


def unfinished_uploads(bucket: str) -> list[str]:
    import fsspec

    listed = fsspec.filesystem("s3").call_s3("list_multipart_uploads", Bucket=bucket)
    return [upload["Key"] for upload in listed.get("Uploads", [])]


def test_a_write_to_s3_cut_mid_part_goes_on_from_its_last_part(
    tmp_path: Path, s3: S3Server, cutting_s3: CuttingProxy
) -> None:
    bucket = s3.new_bucket()
    box, courier, server = outbox(tmp_path, store.job_folder(f"s3://{bucket}/team", 7))
    data = os.urandom(3 * store.CHUNK + 5)  # four parts
    save(box.run_dir, 1, data)
    cutting_s3.cut_after(store.CHUNK + store.CHUNK // 2)  # in the second part
    assert not box._upload_checkpoint(courier, node_id=3)  # cut: try later
    assert not box._upload_checkpoint(courier, node_id=3)  # still away: try later
    assert server.records == [] and server.uploads == []  # not sent through the server
    cutting_s3.heal()
    before = cutting_s3.sent
    assert box._upload_checkpoint(courier, node_id=3)
    # The first part was not sent again: the rest is the other three parts.
    resent = cutting_s3.sent - before
    assert 2 * store.CHUNK < resent < 3 * store.CHUNK, resent
    (record,) = server.records
    assert (record.size, record.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert server.uploads == []
    copy = tmp_path / "read-back.pt"
    store.fetch(record.url, copy, record.sha256)
    assert copy.read_bytes() == data
    assert s3.keys(bucket) == [record.url.split(f"s3://{bucket}/", 1)[1]]
    assert unfinished_uploads(bucket) == []


def test_a_newer_checkpoint_replaces_a_cut_write_and_one_that_stays_cut_goes_through_the_server(
    tmp_path: Path, s3: S3Server, cutting_s3: CuttingProxy
) -> None:
    bucket = s3.new_bucket()
    box, courier, server = outbox(tmp_path, store.job_folder(f"s3://{bucket}/team", 7))
    save(box.run_dir, 1, os.urandom(2 * store.CHUNK))
    cutting_s3.cut_after(store.CHUNK + 100)
    assert not box._upload_checkpoint(courier, node_id=3)
    cutting_s3.heal()
    assert unfinished_uploads(bucket) != []
    # Epoch 2's checkpoint arrives before epoch 1's is whole: epoch 1's
    # upload is given up (nothing of it left), epoch 2's written.
    two = os.urandom(store.CHUNK + 7)
    save(box.run_dir, 2, two)
    assert box._upload_checkpoint(courier, node_id=3)
    assert [(r.epoch, r.size) for r in server.records] == [(2, len(two))]
    assert unfinished_uploads(bucket) == []
    assert len(s3.keys(bucket)) == 1
    # A store that stays away: after MAX_CUTS tries that write nothing, this
    # checkpoint and the next go through the server.
    three = os.urandom(store.CHUNK + 9)
    save(box.run_dir, 3, three)
    cutting_s3.cut_after(1000)
    tries = 1
    while not box._upload_checkpoint(courier, node_id=3):
        tries += 1
        assert tries <= MAX_CUTS + 1
    assert server.uploads == [(3, three)] and len(server.records) == 1


def test_a_read_from_s3_cut_mid_object_goes_on_from_its_last_part(
    tmp_path: Path, s3: S3Server, cutting_s3: CuttingProxy
) -> None:
    """A retry's node reads the checkpoint in CHUNK-sized ranges: a cut
    connection costs the range it was in, not what was read before."""
    bucket = s3.new_bucket()
    source = tmp_path / "checkpoint.pt"
    source.write_bytes(os.urandom(3 * store.CHUNK + 5))
    written = store.put(store.job_folder(f"s3://{bucket}/team", 7), "epoch-1.pt", source)
    before = cutting_s3.received
    cutting_s3.cut_after(store.CHUNK + store.CHUNK // 2, sent=False, stay_down=False)
    copy = tmp_path / "copy.pt"
    assert store.fetch(written.url, copy, written.sha256) == written.size
    assert copy.read_bytes() == source.read_bytes()
    read = cutting_s3.received - before
    assert written.size + store.CHUNK // 2 <= read < written.size + store.CHUNK, read
