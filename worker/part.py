"""One part running on this node: its launcher process group, the state it
is in, what it has still to tell the server (its outbox), and how it
ended."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ddpo.failures import FailureReason
from ddpo.lifecycle import Named
from ddpo.schemas import Assignment, PartFinished
from worker import causes, rank_env, runfiles
from worker._process import group_alive, signal_group
from worker.forkserver import ForkServer
from worker.outbox import Outbox
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)


def launcher_env(settings: WorkerSettings) -> dict[str, str]:
    """The launcher's environment, and so its ranks': the allow-list of
    worker/rank_env.py, none of the daemon's secrets."""
    return {**rank_env.for_ranks(os.environ, settings.rank_env_names), "PYTHONUNBUFFERED": "1"}


class Launched(Protocol):
    """A launcher process: a ``subprocess.Popen`` or a ``ForkedLauncher``."""

    pid: int
    returncode: int | Any

    def poll(self) -> int | None: ...


class ProcessGroup(Protocol):
    """A part's processes: its launcher and every rank, in one group."""

    def exit_code(self) -> int | None:
        """The launcher's exit status (negative: the signal), once it exited."""
        ...

    def alive(self) -> bool:
        """Whether any process of the group is left."""
        ...

    def signal(self, signum: signal.Signals) -> None: ...


@dataclass(frozen=True)
class LauncherGroup:
    """The group a launcher leads (its own session: one signal reaches every rank)."""

    launcher: Launched

    def exit_code(self) -> int | None:
        return self.launcher.poll()

    def alive(self) -> bool:
        return group_alive(self.launcher.pid)

    def signal(self, signum: signal.Signals) -> None:
        signal_group(self.launcher.pid, signum)


class PartState(Named):
    """Where a part stands on this node (as torch elastic's ``WorkerState``).

    ``launched -> running`` once its rendezvous port is settled (machine 0
    published the port its launcher bound; the others learnt it);
    ``launched | running -> stopping`` when the server or the node's own
    shutdown asks (SIGTERM to the group); ``stopping -> killed`` once the
    grace period is over (SIGKILL); any state ``-> exited`` once no process
    of the group is left. An exited part leaves the node when its outbox,
    finish report last, has been delivered.
    """

    LAUNCHED = "launched"
    RUNNING = "running"
    STOPPING = "stopping"
    KILLED = "killed"
    EXITED = "exited"


PART_TRANSITIONS: dict[PartState, frozenset[PartState]] = {
    PartState.LAUNCHED: frozenset({PartState.RUNNING, PartState.STOPPING, PartState.EXITED}),
    PartState.RUNNING: frozenset({PartState.STOPPING, PartState.EXITED}),
    PartState.STOPPING: frozenset({PartState.KILLED, PartState.EXITED}),
    PartState.KILLED: frozenset({PartState.EXITED}),
    PartState.EXITED: frozenset(),
}


def move(current: PartState, new: PartState) -> PartState:
    if new not in PART_TRANSITIONS[current]:
        raise ValueError(f"a part on a node cannot go from {current.value} to {new.value}")
    return new


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
    group: ProcessGroup
    outbox: Outbox
    state: PartState = PartState.LAUNCHED
    stop_requested_at: float | None = None
    # The cooperative stop: the server asked the ranks to stop at a step
    # and checkpoint (a file in the run directory they look for); past this
    # moment (monotonic) they are stopped by signal instead.
    stop_deadline: float | None = None

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
            script_dir=settings.script_dir.resolve() if settings.script_dir else None,
            interface=interface,
            cpus=cpus,
            rank_env=settings.rank_env_names,
            hidden=[settings.credential_path.resolve()],
            extensions_dir=settings.extensions_dir.resolve(),
        )
        runfiles.write_launch(config)
        if assignment.master_port is not None and assignment.machine_id > 0:
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
                    env=launcher_env(settings),
                )
        return cls.of(assignment, run_dir, LauncherGroup(process))

    @classmethod
    def of(cls, assignment: Assignment, run_dir: Path, group: ProcessGroup) -> PartProcess:
        """The part whose processes ``group`` holds (launched already)."""
        part = cls(assignment, run_dir, group, Outbox(assignment, run_dir))
        if assignment.master_port is not None and assignment.machine_id > 0:
            part.state = move(part.state, PartState.RUNNING)  # its port came with it
        return part

    @property
    def waits_for_port(self) -> bool:
        """Machine 0 has a port to publish, the others one to learn."""
        return self.state is PartState.LAUNCHED

    def _move(self, new: PartState) -> None:
        self.state = move(self.state, new)

    def bound_port(self) -> int | None:
        """Machine 0: the port its launcher bound, once it has."""
        return runfiles.read_rendezvous(self.run_dir)

    def port_published(self) -> None:
        """Machine 0: the server has the port (or refused it for good)."""
        if self.state is PartState.LAUNCHED:
            self._move(PartState.RUNNING)

    def learn_port(self, master_port: int) -> None:
        """Other machines: hand the launcher the port it waits for."""
        if self.state is PartState.LAUNCHED:
            runfiles.write_rendezvous(self.run_dir, master_port)
            self._move(PartState.RUNNING)

    @property
    def stop_requested(self) -> bool:
        return self.stop_requested_at is not None

    @property
    def asked_to_stop(self) -> bool:
        return self.stop_deadline is not None

    def ask_to_stop(self, reason: str, detail: str | None, grace_s: float) -> None:
        """Ask the ranks to stop at their next agreed step and checkpoint
        there; signal them if they have not within ``grace_s``."""
        if self.asked_to_stop or self.state not in (PartState.LAUNCHED, PartState.RUNNING):
            return
        runfiles.request_stop(self.run_dir, reason, detail)
        self.stop_deadline = time.monotonic() + grace_s
        log.info(
            "part %d (job %d): asked to stop at a step (%s%s), %.0f s to do it",
            self.assignment.part_id,
            self.assignment.job_id,
            reason,
            f" {detail}" if detail else "",
            grace_s,
        )

    def request_stop(self) -> None:
        if self.state in (PartState.LAUNCHED, PartState.RUNNING):
            self.stop_requested_at = time.monotonic()
            self._move(PartState.STOPPING)
            runfiles.request_termination(self.run_dir)  # this SIGTERM is meant
            self.group.signal(signal.SIGTERM)

    def enforce_stop(self, grace_s: float) -> None:
        """SIGTERM ranks asked to stop at a step that have not by their
        deadline; SIGKILL what is left once the grace period after SIGTERM
        is over."""
        if (
            self.stop_deadline is not None
            and not self.stop_requested
            and time.monotonic() >= self.stop_deadline
            and self.group.exit_code() is None
        ):
            log.warning(
                "part %d: ranks did not stop at a step by the deadline; stopping them",
                self.assignment.part_id,
            )
            self.request_stop()
        if (
            self.state is PartState.STOPPING
            and self.stop_requested_at is not None
            and time.monotonic() - self.stop_requested_at >= grace_s
            and self.group.alive()
        ):
            log.warning("part %d: ranks outlived SIGTERM, killing", self.assignment.part_id)
            self.group.signal(signal.SIGKILL)
            self._move(PartState.KILLED)

    def has_ended(self) -> bool:
        """The launcher has exited and no process of its group is left."""
        if self.state is PartState.EXITED:
            return True
        if self.group.exit_code() is None:
            return False
        if self.group.alive():
            # Nobody supervises ranks whose launcher is gone.
            self.group.signal(signal.SIGKILL)
            return False
        self._move(PartState.EXITED)
        return True

    def final_report(self, node_id: int) -> PartFinished:
        exit_code = self.group.exit_code()
        assert exit_code is not None, "the part has not exited"
        outcome = runfiles.read_outcome(self.run_dir)
        result = runfiles.read_result(self.run_dir)
        # An outcome on disk was written before any stop signal landed (the
        # signal kills the launcher before it could write one): report it, so
        # a root cause is not hidden behind the stop it caused. Without one,
        # a rank that raised may still have said so itself.
        if outcome is None and (raised := self._rank_that_raised(node_id)) is not None:
            return raised
        if self.stop_requested_at is not None and outcome is None:
            return PartFinished(node_id=node_id, status="cancelled", exit_code=exit_code)
        if outcome is not None and outcome.status == "succeeded" and exit_code == 0:
            return PartFinished(node_id=node_id, status="succeeded", exit_code=0, result=result)
        if outcome is not None and outcome.status == "stopped" and exit_code == 0:
            saved = runfiles.newest_saved(self.run_dir)
            return PartFinished(
                node_id=node_id,
                status="stopped",
                exit_code=0,
                step=saved.step if saved is not None else None,
            )
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

    def _rank_that_raised(self, node_id: int) -> PartFinished | None:
        """The first rank of this part that recorded an exception of its own
        (worker/rank.py), not only a peer's going: the part's cause where
        its launcher was stopped, or died, before it wrote an outcome. A
        peer's failure reaches the server, which stops this part, while a
        rank that raised here is still on its way out."""
        for rank, text in runfiles.rank_failures(self.run_dir).items():
            if causes.classify(text) is FailureReason.RANK_FAILED:
                return PartFinished(
                    node_id=node_id,
                    status="failed",
                    exit_code=1,  # as the launcher says of an exception
                    failing_rank=rank,
                    reason=FailureReason.RANK_FAILED,
                    message=f"rank {rank} (machine {self.assignment.machine_id}) "
                    "raised an exception",
                    traceback_tail=causes.tail(text),
                )
        return None


def _log_tail(run_dir: Path, chars: int = 4000) -> str | None:
    try:
        with open(run_dir / runfiles.OUTPUT, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - chars))
            return f.read().decode("utf-8", "replace").strip() or None
    except OSError:
        return None
