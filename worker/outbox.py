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
from pathlib import Path

from ddpo.schemas import Assignment, LogLine, PartFinished, ProgressReport
from worker import runfiles
from worker.courier import Courier

log = logging.getLogger(__name__)

LOG_LINES_PER_REQUEST = 2000


class Outbox:
    def __init__(self, assignment: Assignment, run_dir: Path) -> None:
        self.assignment = assignment
        self.run_dir = run_dir
        self._logs = runfiles.LogReader(run_dir)
        self._progress = runfiles.ProgressReader(run_dir)
        self.unsent_logs: list[LogLine] = []
        self.unsent_progress: list[ProgressReport] = []
        self.last_progress: ProgressReport | None = None
        # Where the newest checkpoint the server has was taken (Saved.order).
        self.uploaded: tuple[int, int] | None = None

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
        server lacks it. False: try later."""
        newest = runfiles.newest_saved(self.run_dir)
        if newest is None or (self.uploaded is not None and newest.order() <= self.uploaded):
            return True
        part_id = self.assignment.part_id
        began = time.monotonic()
        try:
            size = newest.path.stat().st_size
            if not courier.deliver(
                f"checkpoint of part {part_id}",
                lambda: courier.client.upload_checkpoint(
                    part_id, node_id, newest.epoch, newest.path, newest.step
                ),
            ):
                return False
        except FileNotFoundError:
            return False  # replaced by a newer epoch's meanwhile: take that one next turn
        log.info(
            "part %d: checkpoint of epoch %d%s uploaded (%d bytes) in %.1f s",
            part_id,
            newest.epoch,
            "" if newest.step is None else f" step {newest.step}",
            size,
            time.monotonic() - began,
        )
        self.uploaded = newest.order()
        return True
