"""What one part has to tell the server, and the order it must be heard in:
its log lines, then its progress, then (machine 0) rank 0's newest
checkpoint, then, once the part has exited, its finish report. Nothing goes
before what comes ahead of it is in: a finish never overtakes the progress
or the checkpoint of its last epoch, and the job's record is whole when the
server settles it. While the server is away everything waits here, in
order; resent lines and reports are recognised by their offsets and
sequence numbers."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from pathlib import Path

from ddpo import store
from ddpo.schemas import Assignment, CheckpointStored, LogLine, PartFinished, ProgressReport
from worker import runfiles
from worker.courier import Courier

log = logging.getLogger(__name__)

LOG_LINES_PER_REQUEST = 2000
# Tries in a row that wrote nothing to the artifact store before a node
# sends its checkpoints through the server instead (each try is itself
# retried by s3fs and botocore, seconds of them).
MAX_CUTS = 3


class Outbox:
    def __init__(self, assignment: Assignment, run_dir: Path) -> None:
        self.assignment = assignment
        self.run_dir = run_dir
        self._logs = runfiles.LogReader(run_dir)
        self._progress = runfiles.ProgressReader(run_dir)
        self.unsent_logs: list[LogLine] = []
        self.unsent_progress: list[ProgressReport] = []
        self.last_progress: ProgressReport | None = None
        # The report before it, for the pace (seconds_left).
        self._earlier_progress: ProgressReport | None = None
        # Where the newest checkpoint the server has was taken (Saved.order).
        self.uploaded: tuple[int, int] | None = None
        # Being written to the artifact store (a cut write goes on from where
        # it stopped), and the tries in a row that wrote nothing.
        self._writing: tuple[tuple[int, int], store.Upload] | None = None
        self._cuts = 0
        # Written to the artifact store, its record not yet heard by the server.
        self._unrecorded: tuple[tuple[int, int], CheckpointStored] | None = None
        # The store failed from this node once: the rest go through the server.
        self._store_failed = False

    @property
    def training_done(self) -> bool:
        """Rank 0 reported the last batch of the last epoch: evaluation and
        exit are all that is left, seconds at most."""
        last = self.last_progress
        return (
            last is not None
            and last.epoch == self.assignment.spec.epochs
            and last.batch == last.batches_per_epoch
        )

    def seconds_left(self) -> float | None:
        """Training time left, by the pace of rank 0's last two reports and
        the time since the last; None before there are two. Lets the daemon
        be back for the part's end rather than a whole report interval
        after it."""
        earlier, last = self._earlier_progress, self.last_progress
        if earlier is None or last is None:
            return None
        per_epoch = last.batches_per_epoch
        epochs = last.epochs or self.assignment.spec.epochs

        def done(report: ProgressReport) -> int:
            return (report.epoch - 1) * report.batches_per_epoch + report.batch

        seconds = (last.at - earlier.at).total_seconds()
        batches = done(last) - done(earlier)
        if batches <= 0 or seconds <= 0:
            return None
        left = max(0, epochs * per_epoch - done(last)) * seconds / batches
        return left - (datetime.now(timezone.utc) - last.at).total_seconds()

    def deliver(self, courier: Courier, node_id: int, finish: PartFinished | None) -> bool:
        """Send what the part has written since, in order, then ``finish``
        (the part has exited: None while it runs). True once the finish is
        delivered: nothing is left to say."""
        ended = finish is not None
        self.unsent_logs.extend(self._logs.read_new(final=ended))
        while ended and (rest := self._logs.read_new(final=True)):
            self.unsent_logs.extend(rest)  # the finish goes after every line
        if not self._ship_logs(courier, node_id):
            return False
        new = self._progress.read_new()
        if new:
            self.unsent_progress.extend(new)
            self._earlier_progress = new[-2] if len(new) > 1 else self.last_progress
            self.last_progress = new[-1]
        if not self._ship_progress(courier, node_id):
            return False
        if self.assignment.machine_id == 0 and not self._upload_checkpoint(courier, node_id):
            return False
        if finish is None:
            return False
        part_id = self.assignment.part_id
        return courier.deliver(
            f"finish of part {part_id}", lambda: courier.client.finish(part_id, finish)
        )

    def _ship_logs(self, courier: Courier, node_id: int) -> bool:
        part_id = self.assignment.part_id
        while self.unsent_logs:
            batch = self.unsent_logs[:LOG_LINES_PER_REQUEST]
            if not courier.deliver(
                f"logs of part {part_id}",
                lambda batch=batch: courier.client.logs(part_id, node_id, batch),  # type: ignore[misc]
            ):
                return False
            del self.unsent_logs[: len(batch)]
        return True

    def _ship_progress(self, courier: Courier, node_id: int) -> bool:
        if not self.unsent_progress:
            return True
        part_id = self.assignment.part_id
        reports = self.unsent_progress
        if not courier.deliver(
            f"progress of part {part_id}",
            lambda: courier.client.progress(part_id, node_id, reports),
        ):
            return False
        self.unsent_progress = []
        return True

    def _upload_checkpoint(self, courier: Courier, node_id: int) -> bool:
        """Send rank 0's newest checkpoint (an epoch's or a stop's) if the
        server lacks it: written to the artifact store and recorded, or
        uploaded to the server. False: try later."""
        newest = runfiles.newest_saved(self.run_dir)
        if newest is None or (self.uploaded is not None and newest.order() <= self.uploaded):
            return True
        part_id = self.assignment.part_id
        began = time.monotonic()
        sent = None
        try:
            size = newest.path.stat().st_size
            if self.assignment.checkpoint_store is not None and not self._store_failed:
                sent = self._record_in_store(
                    courier, node_id, newest, self.assignment.checkpoint_store
                )
            where = "written to the artifact store"
            if sent is None:
                where = "uploaded"
                sent = courier.deliver(
                    f"checkpoint of part {part_id}",
                    lambda: courier.client.upload_checkpoint(
                        part_id, node_id, newest.epoch, newest.path, newest.step
                    ),
                )
            if not sent:
                return False
        except FileNotFoundError:
            return False  # replaced by a newer epoch's meanwhile: take that one next turn
        log.info(
            "part %d: checkpoint of epoch %d%s %s (%d bytes) in %.1f s",
            part_id,
            newest.epoch,
            "" if newest.step is None else f" step {newest.step}",
            where,
            size,
            time.monotonic() - began,
        )
        self.uploaded = newest.order()
        return True

    def _record_in_store(
        self, courier: Courier, node_id: int, newest: runfiles.Saved, folder: str
    ) -> bool | None:
        """Write ``newest`` to the store (once) and have the server record it.
        False: try later; None: the store cannot be written from this node."""
        part_id = self.assignment.part_id
        if self._unrecorded is None or self._unrecorded[0] != newest.order():
            stored = self._write(newest, folder)
            if not isinstance(stored, store.Stored):
                return stored
            record = CheckpointStored(
                node_id=node_id,
                epoch=newest.epoch,
                step=newest.step,
                url=stored.url,
                size=stored.size,
                sha256=stored.sha256,
            )
            self._unrecorded = (newest.order(), record)
        record = self._unrecorded[1]
        if not courier.deliver(
            f"checkpoint record of part {part_id}",
            lambda: courier.client.checkpoint_stored(part_id, record),
        ):
            return False
        self._unrecorded = None
        return True

    def _write(self, newest: runfiles.Saved, folder: str) -> store.Stored | bool | None:
        """Write ``newest`` to the store, going on from where an earlier try
        was cut. The object once whole; False: cut again, go on next turn;
        None: the store cannot be written from this node."""
        part_id = self.assignment.part_id
        order = newest.order()
        if self._writing is not None and self._writing[0] != order:
            self._writing[1].abort()  # a newer checkpoint replaces the unfinished one
            self._writing = None
        if self._writing is None:
            name = store.checkpoint_name(newest.epoch, newest.step)
            self._writing = (order, store.Upload(folder, name, newest.path))
            self._cuts = 0
        upload = self._writing[1]
        before = upload.sent
        try:
            stored = upload.advance()
        except Exception as exc:  # any library's failure (botocore, aiohttp)
            if not newest.path.exists():
                upload.abort()
                self._writing = None
                raise FileNotFoundError(newest.path) from exc
            self._cuts = 0 if upload.sent > before else self._cuts + 1
            if not store.is_unusable(exc) and self._cuts < MAX_CUTS:
                log.warning(
                    "part %d: writing its checkpoint to the artifact store was cut after "
                    "%d of %d bytes (%s: %s); it goes on from there",
                    part_id,
                    upload.sent,
                    newest.path.stat().st_size,
                    type(exc).__name__,
                    exc,
                )
                return False
            # No credentials here, no route to the store, s3fs missing:
            # the server writes to the store for this node instead.
            log.warning(
                "part %d: the artifact store cannot be written from this node (%s: %s); "
                "its checkpoints go through the server",
                part_id,
                type(exc).__name__,
                exc,
            )
            upload.abort()
            self._writing = None
            self._store_failed = True
            return None
        self._writing = None
        return stored
