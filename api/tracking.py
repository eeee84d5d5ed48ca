"""Runs where teams already look: rank 0's reports, as each server records
them, written on to TensorBoard event files (``DDPO_TENSORBOARD_DIR``, one
folder per job: ``tensorboard --logdir`` shows every job) and to an MLflow
run per job (``DDPO_MLFLOW_TRACKING_URI``: the spec as params, the reports
and the result as metrics, the final model as an artifact, the job's id
and owner as tags; api/core/runs.py makes the run).

Off the request path: a report is queued once its transaction has
committed and written by one thread of this server, so a slow disk never
holds a node's report or a database transaction. Each server writes the
reports it records to an event file of its own in the job's folder
(TensorBoard reads every file of a folder as one run). Off unless
configured: a server without it loads none of tensorboard.
"""

from __future__ import annotations

import logging
import os
import queue
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ddpo.lifecycle import JobStatus
from ddpo.schemas import ProgressReport, TrainResult, report_step

log = logging.getLogger(__name__)

# MLflow takes at most this many metrics in one request (log_batch).
MLFLOW_BATCH = 1000
# After MLflow fails a request, it is left alone this long: jobs start and
# run untracked meanwhile, rather than wait on it (or fill the log).
MLFLOW_DOWN_FOR_S = 60.0
# MLflow's client retries a request 7 times over minutes by default: a node
# asking for its job's run would hold its part's start that long. Here one
# retry, 10 s without an answer (an operator's own MLFLOW_HTTP_* win).
MLFLOW_CLIENT_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}
# What a job's status is as an MLflow run's.
RUN_STATUS = {
    JobStatus.SUCCEEDED: "FINISHED",
    JobStatus.FAILED: "FAILED",
    JobStatus.CANCELLED: "KILLED",
}

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


@dataclass(frozen=True)
class Ended:
    """A job that ended: how, its result, and the step it ended at."""

    status: JobStatus
    result: TrainResult | None
    final_step: int | None


class Sink(Protocol):
    def write(self, job_id: int, points: list[Point]) -> None: ...

    def ended(self, job_id: int, ended: Ended) -> None: ...

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

    def ended(self, job_id: int, ended: Ended) -> None:
        writer = self._writers.pop(job_id, None)
        if writer is not None:
            writer.close()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()


class MLflow:
    """A run per job in an MLflow tracking server, through MLflow's own
    client (``mlflow-skinny``, imported on first use). The run is made by
    api/core/runs.py (``run_of`` finds or makes it); this writes to it."""

    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        run_of: Callable[[int], str | None],
        existing_run: Callable[[int], str | None],
        final_model: Callable[[int], tuple[Any, int] | None],
    ) -> None:
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        # The job's run, made if it has none; the one it has, if any.
        self.run_of, self.existing_run = run_of, existing_run
        self.final_model = final_model
        self._experiment_id: str | None = None
        self._lock = threading.Lock()
        self._mlflow_client: Any = None
        self._down_until = 0.0
        for name, value in MLFLOW_CLIENT_ENV.items():
            os.environ.setdefault(name, value)  # read by MLflow's client, in this server only

    def __repr__(self) -> str:
        return f"MLflow at {self.tracking_uri}"

    def available(self) -> bool:
        """False for a while after MLflow failed a request (``failed``)."""
        return time.monotonic() >= self._down_until

    def failed(self, exc: BaseException) -> None:
        if self.available():
            log.warning(
                "MLflow at %s failed (%s: %s); jobs run untracked for the next %.0f s",
                self.tracking_uri,
                type(exc).__name__,
                exc,
                MLFLOW_DOWN_FOR_S,
            )
        self._down_until = time.monotonic() + MLFLOW_DOWN_FOR_S

    def client(self) -> Any:
        with self._lock:
            if self._mlflow_client is None:
                from mlflow.tracking import MlflowClient

                self._mlflow_client = MlflowClient(self.tracking_uri)
            return self._mlflow_client

    def experiment_id(self) -> str:
        with self._lock:
            known = self._experiment_id
        if known is not None:
            return known
        client = self.client()
        found = client.get_experiment_by_name(self.experiment)
        if found is not None:
            found_id: str = found.experiment_id
        else:
            try:
                found_id = client.create_experiment(self.experiment)
            except Exception:  # another server made it meanwhile
                found = client.get_experiment_by_name(self.experiment)
                if found is None:
                    raise
                found_id = found.experiment_id
        with self._lock:
            self._experiment_id = found_id
        return found_id

    def create_run(self, job_id: int, name: str, owner: str | None, params: dict[str, str]) -> str:
        from mlflow.entities import Param

        client = self.client()
        run = client.create_run(
            self.experiment_id(),
            run_name=name,
            tags={"ddpo.job_id": str(job_id), "ddpo.owner": owner or ""},
        )
        run_id: str = run.info.run_id
        items = [Param(key, value) for key, value in params.items()]
        for start in range(0, len(items), 100):  # MLflow's limit of params a request
            client.log_batch(run_id, params=items[start : start + 100])
        return run_id

    def delete_run(self, run_id: str) -> None:
        self.client().delete_run(run_id)

    def write(self, job_id: int, points: list[Point]) -> None:
        from mlflow.entities import Metric

        run_id = self.run_of(job_id) if self.available() else None
        if run_id is None:
            return
        metrics = [
            Metric(name, value, int(point.wall_time * 1000), point.step)
            for point in points
            for name, value in point.values.items()
        ]
        try:
            for start in range(0, len(metrics), MLFLOW_BATCH):
                self.client().log_batch(run_id, metrics=metrics[start : start + MLFLOW_BATCH])
        except Exception as exc:  # MLflow's and requests' errors alike
            self.failed(exc)

    def ended(self, job_id: int, ended: Ended) -> None:
        """The result as metrics, the final model as an artifact (``model/``),
        the run's status: once, though the job's row may change again."""
        run_id = self.existing_run(job_id)  # a job that never ran has none
        if run_id is None or not self.available():
            return
        try:
            self._settle(run_id, job_id, ended)
        except Exception as exc:  # MLflow's and requests' errors alike
            self.failed(exc)

    def _settle(self, run_id: str, job_id: int, ended: Ended) -> None:
        from mlflow.entities import Metric

        client = self.client()
        if client.get_run(run_id).info.status in set(RUN_STATUS.values()):
            return  # settled already (a later change to the job's row)
        result = ended.result.model_dump(exclude_none=True) if ended.result else {}
        now_ms = int(time.time() * 1000)
        step = ended.final_step or 0
        numbers = [
            Metric(f"result.{key}", float(value), now_ms, step)
            for key, value in result.items()
            if isinstance(value, int | float) and not isinstance(value, bool)
        ]
        if numbers:
            client.log_batch(run_id, metrics=numbers)
        if ended.status is JobStatus.SUCCEEDED:
            self._log_model(client, run_id, job_id)
        client.set_terminated(run_id, RUN_STATUS[ended.status])

    def close(self) -> None:
        pass  # MLflow's client holds nothing to release

    def _log_model(self, client: Any, run_id: str, job_id: int) -> None:
        opened = self.final_model(job_id)
        if opened is None:
            return
        file, epoch = opened
        with tempfile.TemporaryDirectory(prefix="ddpo-mlflow-") as folder:
            path = Path(folder) / f"job-{job_id}-epoch-{epoch}.pt"
            with file, open(path, "wb") as out:
                while block := file.read(16 * 2**20):
                    out.write(block)
            client.log_artifact(run_id, str(path), artifact_path="model")


class Tracking:
    """This server's sinks, fed by one thread from a queue."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks
        self._queue: queue.Queue[tuple[int, list[Point] | Ended] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def mlflow(self) -> MLflow | None:
        return next((s for s in self.sinks if isinstance(s, MLflow)), None)

    def reported(self, job_id: int, reports: Iterable[ProgressReport]) -> None:
        """Reports of ``job_id`` just committed: written on soon."""
        if self.sinks and (found := points(reports)):
            self._put((job_id, found))

    def ended(self, job_id: int, ended: Ended) -> None:
        """``job_id`` just ended (committed): its run settled soon."""
        if self.sinks:
            self._put((job_id, ended))

    def _put(self, item: tuple[int, list[Point] | Ended]) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._write_forever, name="ddpo-tracking", daemon=True
                )
                self._thread.start()
        self._queue.put(item)

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
                job_id, what = item
                for sink in self.sinks:
                    try:
                        if isinstance(what, Ended):
                            sink.ended(job_id, what)
                        else:
                            sink.write(job_id, what)
                    except Exception:  # a sink's trouble (a full disk, MLflow down) stops no other
                        log.exception("job %d: not written to %r", job_id, sink)
            finally:
                self._queue.task_done()
