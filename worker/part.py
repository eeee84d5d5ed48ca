"""One part running on this node: its launcher process group, the reports
it has written, and how it ended."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from api.failures import FailureReason
from api.schemas import Assignment, LogLine, PartFinished, ProgressReport
from worker import runfiles
from worker._process import group_alive, signal_group
from worker.forkserver import ForkServer
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)


def _launcher_env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


class Launched(Protocol):
    """A launcher process: a ``subprocess.Popen`` or a ``ForkedLauncher``."""

    pid: int
    returncode: int | Any

    def poll(self) -> int | None: ...


def run_dir_for(work_dir: Path, assignment: Assignment) -> Path:
    return (
        work_dir
        / f"job-{assignment.job_id}"
        / f"attempt-{assignment.attempt_id}-machine-{assignment.machine_id}"
    )


@dataclass
class PartProcess:
    assignment: Assignment
    run_dir: Path
    process: Launched
    progress: runfiles.ProgressReader
    logs: runfiles.LogReader
    unsent: list[ProgressReport] = field(default_factory=list)
    unsent_logs: list[LogLine] = field(default_factory=list)
    stop_requested_at: float | None = None
    killed: bool = False
    rendezvous_known: bool = False
    uploaded_epoch: int = 0
    last_progress: ProgressReport | None = None

    @classmethod
    def launch(
        cls,
        assignment: Assignment,
        settings: WorkerSettings,
        *,
        interface: str | None,
        cpus: int,
        forks: ForkServer | None = None,
        resume_from: Path | None = None,
    ) -> PartProcess:
        run_dir = run_dir_for(settings.work_dir.resolve(), assignment)
        config = runfiles.LaunchConfig(
            assignment=assignment,
            run_dir=run_dir,
            data_dir=settings.data_dir.resolve(),
            trainers=settings.trainers,
            process_group_timeout_s=settings.process_group_timeout_s,
            parent_pid=os.getpid(),
            resume_from=resume_from,
            interface=interface,
            cpus=cpus,
        )
        runfiles.write_launch(config)
        known = assignment.master_port is not None and assignment.machine_id > 0
        if assignment.master_port is not None and known:
            runfiles.write_rendezvous(run_dir, assignment.master_port)
        process: Launched | None = None
        if forks is not None and forks.ready():
            try:
                process = forks.launch(run_dir)
            except OSError as exc:
                log.warning("fork server failed (%s); starting the launcher afresh", exc)
                forks.close()  # a late fork dies with it
        if process is None:
            with open(run_dir / runfiles.OUTPUT, "ab") as output:
                process = subprocess.Popen(
                    [sys.executable, "-m", "worker.launcher", str(run_dir)],
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    # Its own session: one signal to the group reaches every rank.
                    start_new_session=True,
                    env=_launcher_env(),
                )
        return cls(
            assignment,
            run_dir,
            process,
            runfiles.ProgressReader(run_dir),
            runfiles.LogReader(run_dir),
            rendezvous_known=known,
        )

    def bound_port(self) -> int | None:
        """Machine 0: the port its launcher bound, once it has."""
        return runfiles.read_rendezvous(self.run_dir)

    def learn_port(self, master_port: int) -> None:
        """Other machines: hand the launcher the port it waits for."""
        if not self.rendezvous_known:
            runfiles.write_rendezvous(self.run_dir, master_port)
            self.rendezvous_known = True

    def read_progress(self) -> None:
        new = self.progress.read_new()
        if new:
            self.unsent.extend(new)
            self.last_progress = new[-1]

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

    @property
    def pgid(self) -> int:
        return self.process.pid

    def request_stop(self) -> None:
        if self.stop_requested_at is None:
            self.stop_requested_at = time.monotonic()
            signal_group(self.pgid, signal.SIGTERM)

    def enforce_stop(self, grace_s: float) -> None:
        """SIGKILL what is left once the grace period after SIGTERM is over."""
        if (
            self.stop_requested_at is not None
            and not self.killed
            and time.monotonic() - self.stop_requested_at >= grace_s
            and group_alive(self.pgid)
        ):
            log.warning("part %d: ranks outlived SIGTERM, killing", self.assignment.part_id)
            signal_group(self.pgid, signal.SIGKILL)
            self.killed = True

    def has_ended(self) -> bool:
        """The launcher has exited and no process of its group is left."""
        if self.process.poll() is None:
            return False
        if group_alive(self.pgid):
            # Nobody supervises ranks whose launcher is gone.
            signal_group(self.pgid, signal.SIGKILL)
            return False
        return True

    def final_report(self, node_id: int) -> PartFinished:
        exit_code = self.process.returncode
        outcome = runfiles.read_outcome(self.run_dir)
        result = runfiles.read_result(self.run_dir)
        # An outcome on disk was written before any stop signal landed (the
        # signal kills the launcher before it could write one): report it, so
        # a root cause is not hidden behind the stop it caused.
        if self.stop_requested_at is not None and outcome is None:
            return PartFinished(node_id=node_id, status="cancelled", exit_code=exit_code)
        if outcome is not None and outcome.status == "succeeded" and exit_code == 0:
            return PartFinished(node_id=node_id, status="succeeded", exit_code=0, result=result)
        if outcome is None:
            how = (
                f"was killed by {signal.Signals(-exit_code).name}"
                if exit_code < 0
                else f"exited with code {exit_code} without recording an outcome"
            )
            return PartFinished(
                node_id=node_id,
                status="failed",
                exit_code=exit_code,
                reason=FailureReason.LAUNCHER_DIED,
                message=f"the launcher of machine {self.assignment.machine_id} {how}",
                traceback_tail=_log_tail(self.run_dir),
            )
        return PartFinished(
            node_id=node_id,
            status="failed",
            exit_code=outcome.exit_code if outcome.exit_code is not None else exit_code,
            failing_rank=outcome.failing_rank,
            reason=outcome.reason,
            message=outcome.message,
            traceback_tail=outcome.traceback_tail or _log_tail(self.run_dir),
            result=result,
        )


def _log_tail(run_dir: Path, chars: int = 4000) -> str | None:
    try:
        with open(run_dir / runfiles.OUTPUT, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - chars))
            return f.read().decode("utf-8", "replace").strip() or None
    except OSError:
        return None
