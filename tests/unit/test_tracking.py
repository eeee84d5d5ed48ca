"""api/tracking.py: reports written on by one thread, to every sink; a
sink that fails does not stop the others; more jobs than event files kept
open are all written."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from api import tracking
from api.tracking import Point, TensorBoard, Tracking
from ddpo.schemas import ProgressReport

AT = datetime(2026, 12, 5, tzinfo=timezone.utc)


def report(seq: int) -> ProgressReport:
    return ProgressReport(
        seq=seq, epoch=1, batch=seq + 1, batches_per_epoch=10, loss=1.0 + seq, at=AT
    )


def losses(folder: Path) -> list[tuple[int, float]]:
    events = EventAccumulator(str(folder))
    events.Reload()
    # By step, as TensorBoard charts them (a job's reopened file may be read first).
    return sorted((e.step, e.value) for e in events.Scalars("loss"))


class Broken:
    def write(self, job_id: int, points: list[Point]) -> None:
        raise OSError("No space left on device")

    def ended(self, job_id: int, ended: tracking.Ended) -> None:
        raise OSError("No space left on device")

    def close(self) -> None:
        pass


def test_every_job_is_written_though_a_sink_fails_and_few_files_stay_open(
    tmp_path: Path,
) -> None:
    board = TensorBoard(tmp_path)
    tracks = Tracking([Broken(), board])
    jobs = range(1, tracking.MAX_OPEN_WRITERS + 6)
    for job_id in jobs:
        tracks.reported(job_id, [report(1), report(0)])
    for job_id in jobs:
        tracks.reported(job_id, [report(2)])  # the first jobs' files were closed
    tracks.flush()
    assert len(board._writers) == tracking.MAX_OPEN_WRITERS
    tracks.close()
    for job_id in jobs:
        assert losses(tmp_path / f"job-{job_id}") == [(1, 1.0), (2, 2.0), (3, 3.0)]
