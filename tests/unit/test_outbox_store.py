"""Machine 0's outbox with an artifact store (worker/outbox.py): a
checkpoint is written to the store once and its record sent until the
server has heard it; a store this node cannot write to sends it through
the server instead, from then on."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ddpo import store
from ddpo.schemas import Assignment, CheckpointStored, JobSpec
from worker import runfiles
from worker.client import ServerUnavailable
from worker.courier import Courier
from worker.outbox import Outbox


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
