"""Runs where teams already look: rank 0's reports, as each server records
them, written on to TensorBoard event files (``DDPO_TENSORBOARD_DIR``, one
folder per job: ``tensorboard --logdir`` shows every job).

Off the request path: a report is queued once its transaction has
committed and written by one thread of this server, so a slow disk never
holds a node's report or a database transaction. Each server writes the
reports it records to an event file of its own in the job's folder
(TensorBoard reads every file of a folder as one run). Off unless
configured: a server without it loads none of tensorboard.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ddpo.schemas import ProgressReport, report_step

log = logging.getLogger(__name__)

# Event files kept open at once; the least recently written is closed
# beyond (and opened anew, as a new file, if its job reports again).
MAX_OPEN_WRITERS = 32


@dataclass(frozen=True)
class Point:
    """One report as scalars: the step GET /jobs/{id}/metrics gives it, its
    time, and each number reported under the name the API gives it."""

    step: int
    wall_time: float
    values: dict[str, float]


def points(reports: Iterable[ProgressReport]) -> list[Point]:
    found = []
    for r in sorted(reports, key=lambda r: r.seq):
        values = {"loss": r.loss, "samples_per_sec": r.samples_per_sec, **(r.metrics or {})}
        found.append(
            Point(
                step=report_step(r.step, r.epoch, r.batch, r.batches_per_epoch),
                wall_time=r.at.timestamp(),
                values={name: v for name, v in values.items() if v is not None},
            )
        )
    return found


class Sink(Protocol):
    def write(self, job_id: int, points: list[Point]) -> None: ...

    def close(self) -> None: ...


class TensorBoard:
    """Event files under ``directory/job-<id>/``, as torch's SummaryWriter
    writes them (tensorboard's own writer and protos, without torch)."""

    def __init__(self, directory: Path) -> None:
        # Imported here: only a server that writes event files loads it.
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary, self._writer_type = Event, Summary, EventFileWriter
        self.directory = directory
        self._writers: OrderedDict[int, Any] = OrderedDict()

    def _writer(self, job_id: int) -> Any:
        writer = self._writers.pop(job_id, None)
        if writer is None:
            folder = self.directory / f"job-{job_id}"
            folder.mkdir(parents=True, exist_ok=True)
            writer = self._writer_type(str(folder))
        self._writers[job_id] = writer
        while len(self._writers) > MAX_OPEN_WRITERS:
            _, oldest = self._writers.popitem(last=False)
            oldest.close()
        return writer

    def write(self, job_id: int, points: list[Point]) -> None:
        writer = self._writer(job_id)
        for point in points:
            summary = self._summary(
                value=[
                    self._summary.Value(tag=name, simple_value=value)
                    for name, value in point.values.items()
                ]
            )
            writer.add_event(
                self._event(wall_time=point.wall_time, step=point.step, summary=summary)
            )
        writer.flush()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()


class Tracking:
    """This server's sinks, fed by one thread from a queue."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks
        self._queue: queue.Queue[tuple[int, list[Point]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @classmethod
    def configured(cls, tensorboard_dir: Path | None) -> Tracking:
        sinks: list[Sink] = []
        if tensorboard_dir is not None:
            sinks.append(TensorBoard(tensorboard_dir))
        return cls(sinks)

    def reported(self, job_id: int, reports: Iterable[ProgressReport]) -> None:
        """Reports of ``job_id`` just committed: written on soon."""
        if not self.sinks:
            return
        found = points(reports)
        if not found:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._write_forever, name="ddpo-tracking", daemon=True
                )
                self._thread.start()
        self._queue.put((job_id, found))

    def flush(self) -> None:
        """Wait until everything queued so far is written."""
        self._queue.join()

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()
        for sink in self.sinks:
            sink.close()

    def _write_forever(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                job_id, found = item
                for sink in self.sinks:
                    try:
                        sink.write(job_id, found)
                    except Exception:  # a sink's trouble (a full disk) never stops the others
                        log.exception("job %d: reports not written to %s", job_id, sink)
            finally:
                self._queue.task_done()
