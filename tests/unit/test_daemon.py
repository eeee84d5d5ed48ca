"""The worker daemon and a part, driven turn by turn against a fake server
and fake process groups: no HTTP, no processes. What a real launcher
writes (progress, log lines, its outcome) the test writes into the run
directory with the launcher's own writers."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, cast

import pytest

from ddpo.failures import FailureReason
from ddpo.lifecycle import StopReason
from ddpo.schemas import (
    Assignment,
    JobSpec,
    LogLine,
    NodeRegistered,
    NodeRegistration,
    PartFinished,
    PollResponse,
    ProgressReport,
    Rendezvous,
    StopRequest,
    Topology,
)
from worker import runfiles
from worker.client import Refused, ServerClient, ServerUnavailable
from worker.daemon import FINISHING_CHECK_S, Worker
from worker.part import PART_TRANSITIONS, PartProcess, PartState, move, run_dir_for
from worker.settings import WorkerSettings

NODE_ID = 7


@dataclass
class FakeGroup:
    """A part's processes, as the test decides: alive until ``exit()``."""

    code: int | None = None
    signals: list[signal.Signals] = field(default_factory=list)
    survives_sigterm: bool = False

    def exit_code(self) -> int | None:
        return self.code

    def alive(self) -> bool:
        return self.code is None

    def signal(self, signum: signal.Signals) -> None:
        self.signals.append(signum)
        if signum is signal.SIGKILL or not self.survives_sigterm:
            self.code = -int(signum)

    def exit(self, code: int) -> None:
        self.code = code


class FakeServer:
    """What the daemon calls on its client; records every call in order.
    ``down`` makes the named calls fail as an unreachable server would,
    ``refuse`` as a server refusing them."""

    def __init__(self) -> None:
        self.url = "http://127.0.0.1:9"  # where it would be; nothing is sent
        self.credential: str | None = None
        self.calls: list[tuple[str, Any]] = []
        self.responses: list[PollResponse] = []
        self.down: set[str] = set()
        self.refuse: set[str] = set()
        self.waits: list[float] = []

    def _call(self, name: str, what: Any) -> None:
        if name in self.down:
            raise ServerUnavailable(f"{name}: connection refused")
        self.calls.append((name, what))
        if name in self.refuse:
            raise Refused(409, f"{name} refused")

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def register(self, registration: NodeRegistration, token: str | None) -> NodeRegistered:
        self._call("register", registration)
        return NodeRegistered(
            node_id=NODE_ID,
            credential="ddpo-node-test",
            heartbeat_timeout_s=3600,
            poll_wait_s=0,
            heartbeat_interval_s=3600,  # no beat goes out during a test
        )

    def poll(
        self,
        node_id: int,
        active: list[int],
        waiting_for_port: list[int],
        wait_s: float,
        asked_to_stop: list[int] | None = None,
    ) -> PollResponse:
        self._call("poll", (active, waiting_for_port))
        self.waits.append(wait_s)
        self.asked_to_stop = asked_to_stop or []
        return self.responses.pop(0) if self.responses else PollResponse(start=[], stop=[])

    def started(self, part_id: int, node_id: int) -> bool:
        self._call("started", part_id)
        return True

    def rendezvous(self, part_id: int, node_id: int, master_port: int) -> bool:
        self._call("rendezvous", master_port)
        return True

    def progress(self, part_id: int, node_id: int, reports: list[ProgressReport]) -> bool:
        self._call("progress", [r.seq for r in reports])
        return True

    def logs(self, part_id: int, node_id: int, lines: list[LogLine]) -> bool:
        self._call("logs", [line.text for line in lines])
        return True

    def upload_checkpoint(
        self, part_id: int, node_id: int, epoch: int, path: Path, step: int | None = None
    ) -> bool:
        self._call("checkpoint", epoch if step is None else (epoch, step))
        return True

    def download_checkpoint(self, job_id: int, destination: Path) -> None:
        self._call("download", job_id)
        destination.write_bytes(b"checkpoint")

    def finish(self, part_id: int, report: PartFinished) -> bool:
        self._call("finish", report)
        return True

    def close(self) -> None:
        pass


@dataclass
class Launcher:
    """Stands in for ``PartProcess.launch``: the run directory is real, the
    processes are a FakeGroup per part."""

    work_dir: Path
    groups: dict[int, FakeGroup] = field(default_factory=dict)

    def __call__(self, assignment: Assignment, settings: WorkerSettings, **_: Any) -> PartProcess:
        run_dir = run_dir_for(self.work_dir, assignment)
        run_dir.mkdir(parents=True, exist_ok=True)
        group = self.groups.setdefault(assignment.part_id, FakeGroup())
        return PartProcess.of(assignment, run_dir, group)


def assignment(part_id: int = 1, machine_id: int = 0, port: int | None = None) -> Assignment:
    return Assignment(
        part_id=part_id,
        job_id=1,
        attempt_id=1,
        machine_id=machine_id,
        spec=JobSpec(epochs=1, topology=Topology(num_machines=machine_id + 1)),
        master_addr="127.0.0.1",
        master_port=port,
    )


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


@pytest.fixture
def launcher(tmp_path: Path) -> Launcher:
    return Launcher((tmp_path / "runs").resolve())


@pytest.fixture
def worker(
    tmp_path: Path, server: FakeServer, launcher: Launcher, monkeypatch: pytest.MonkeyPatch
) -> Worker:
    # An unreachable server is retried at once here, not after a backoff.
    monkeypatch.setattr("worker.courier.FIRST_BACKOFF_S", 0.0)
    monkeypatch.setattr("worker.courier.MAX_BACKOFF_S", 0.0)
    settings = WorkerSettings(
        server_url="http://127.0.0.1:9",
        name="node-a",
        work_dir=launcher.work_dir,
        data_dir=tmp_path / "data",
        prewarm=False,
        stop_grace_s=0,
    )
    daemon = Worker(settings, client=cast(ServerClient, server), launch=launcher)
    daemon.step()  # registers
    assert daemon.node_id == NODE_ID
    return daemon


def run_dir(launcher: Launcher, part_id: int = 1, machine_id: int = 0) -> Path:
    return run_dir_for(launcher.work_dir, assignment(part_id, machine_id))


def train(directory: Path, outcome: str = "succeeded", reason: FailureReason | None = None) -> None:
    """What the launcher and rank 0 write while the part runs and as it ends."""
    progress = runfiles.ProgressWriter(directory)
    progress(epoch=1, batch=10, batches_per_epoch=10, loss=0.1, samples_per_sec=100.0)
    progress.close()
    runfiles.rank_log(directory, 0).write_text("Train Epoch: 1 [done]\n")
    runfiles.checkpoint_path(directory, 1).write_bytes(b"weights")
    runfiles.write_outcome(
        directory, runfiles.Outcome(status=outcome, reason=reason, exit_code=0 if reason else None)
    )


def finished(server: FakeServer) -> PartFinished:
    """The last finish report the server took."""
    report: PartFinished = [what for name, what in server.calls if name == "finish"][-1]
    return report


def until(condition: Callable[[], bool], worker: Worker, turns: int = 20) -> None:
    for _ in range(turns):
        if condition():
            return
        worker.step()
    raise AssertionError(f"not after {turns} turns")


def test_every_part_state_moves_only_as_documented() -> None:
    for current, allowed in PART_TRANSITIONS.items():
        for new in PartState:
            if new in allowed:
                assert move(current, new) is new
            else:
                with pytest.raises(ValueError, match=f"from {current.value} to {new.value}"):
                    move(current, new)
    assert PART_TRANSITIONS[PartState.EXITED] == frozenset()


def test_a_part_reports_logs_then_progress_then_checkpoint_then_its_finish(
    worker: Worker, server: FakeServer, launcher: Launcher
) -> None:
    server.responses.append(PollResponse(start=[assignment()], stop=[]))
    worker.step()
    assert 1 in worker.parts and server.names()[-1] == "started"
    train(run_dir(launcher))
    launcher.groups[1].exit(0)
    until(lambda: not worker.parts, worker)
    reports = [
        call for call in server.calls if call[0] in ("logs", "progress", "checkpoint", "finish")
    ]
    assert [name for name, _ in reports] == ["logs", "progress", "checkpoint", "finish"]
    finish = finished(server)
    assert finish.status == "succeeded" and finish.exit_code == 0


def test_nothing_overtakes_while_the_server_is_away(
    worker: Worker, server: FakeServer, launcher: Launcher
) -> None:
    server.responses.append(PollResponse(start=[assignment()], stop=[]))
    worker.step()
    train(run_dir(launcher))
    launcher.groups[1].exit(0)
    server.down = {"progress"}
    for _ in range(3):
        worker.step()
    assert "finish" not in server.names() and 1 in worker.parts  # held back, in order
    server.down = set()
    until(lambda: not worker.parts, worker)
    order = [n for n in server.names() if n in ("progress", "checkpoint", "finish")]
    assert order == ["progress", "checkpoint", "finish"]


def test_a_refused_report_is_dropped_and_the_rest_still_goes(
    worker: Worker, server: FakeServer, launcher: Launcher
) -> None:
    server.responses.append(PollResponse(start=[assignment()], stop=[]))
    worker.step()
    train(run_dir(launcher), outcome="failed", reason=FailureReason.RANK_FAILED)
    launcher.groups[1].exit(1)
    server.refuse = {"progress"}
    until(lambda: not worker.parts, worker)
    assert server.names().count("progress") == 1  # refused once, not resent
    finish = finished(server)
    assert finish.status == "failed" and finish.reason is FailureReason.RANK_FAILED


def test_a_stopped_part_gets_sigterm_then_sigkill_then_is_reported_cancelled(
    worker: Worker, server: FakeServer, launcher: Launcher
) -> None:
    launcher.groups[1] = FakeGroup(survives_sigterm=True)
    server.responses += [
        PollResponse(start=[assignment()], stop=[]),
        PollResponse(start=[], stop=[1]),
    ]
    worker.step()
    worker.step()  # told to stop
    until(lambda: not worker.parts, worker)
    assert launcher.groups[1].signals == [signal.SIGTERM, signal.SIGKILL]
    finish = finished(server)
    assert finish.status == "cancelled" and finish.exit_code == -int(signal.SIGKILL)


PEER_WENT = "RuntimeError: [pair.cc:561] Connection closed by peer [10.0.0.2]:4485"


@pytest.mark.parametrize("recorded", [{}, {0: PEER_WENT}])
def test_a_part_stopped_before_any_of_its_ranks_raised_is_reported_cancelled(
    worker: Worker, server: FakeServer, launcher: Launcher, recorded: dict[int, str]
) -> None:
    """Only a peer's going (a symptom the server has from elsewhere), or
    nothing at all, on disk: the stop ended the part."""
    server.responses += [
        PollResponse(start=[assignment()], stop=[]),
        PollResponse(start=[], stop=[1]),
    ]
    worker.step()
    for rank, text in recorded.items():
        runfiles.write_rank_failure(run_dir(launcher), rank, text)
    worker.step()  # told to stop: SIGTERM ends the launcher before any outcome
    until(lambda: not worker.parts, worker)
    assert finished(server).status == "cancelled"


def test_a_rank_that_raised_before_its_part_was_stopped_is_the_parts_cause(
    worker: Worker, server: FakeServer, launcher: Launcher
) -> None:
    """What CI saw (tests/e2e/test_training.py, 1 run in several on a busy
    host): rank 1 raised on machine 1 and left the group; rank 0 on machine
    0 lost its peer, and that symptom reached the server first, which then
    stopped machine 1, whose launcher died of the SIGTERM while its rank
    was still exiting. The rank had recorded its exception: that is the
    part's report, and so the job's error, not a cancellation."""
    server.responses += [
        PollResponse(start=[assignment(1, machine_id=1, port=29500)], stop=[]),
        PollResponse(start=[], stop=[1]),
    ]
    worker.step()
    folder = run_dir(launcher, 1, machine_id=1)
    runfiles.write_rank_failure(folder, 0, PEER_WENT)  # not the cause
    runfiles.write_rank_failure(
        folder, 1, "Traceback (most recent call last):\nValueError: injected failure on rank 1"
    )
    a_moment_ago(folder)
    worker.step()
    until(lambda: not worker.parts, worker)
    finish = finished(server)
    assert (finish.status, finish.reason, finish.failing_rank) == (
        "failed",
        FailureReason.RANK_FAILED,
        1,
    )
    assert finish.message == "rank 1 (machine 1) raised an exception"
    assert "ValueError: injected failure on rank 1" in (finish.traceback_tail or "")


def a_moment_ago(folder: Path) -> None:
    """Date the ranks' records a second back: they came before the stop
    (in a real run by the time the peer's report took to travel)."""
    for record in folder.glob("rank-*.failed"):
        then = record.stat().st_mtime_ns - 1_000_000_000
        os.utime(record, ns=(then, then))


@dataclass
class RaisesOnSigterm(FakeGroup):
    """A script whose own SIGTERM handler raises: it records the exception
    (worker/script_rank.py) and exits 1."""

    folder: Path | None = None

    def signal(self, signum: signal.Signals) -> None:
        if signum is signal.SIGTERM and self.folder is not None:
            runfiles.write_rank_failure(
                self.folder, 0, "Traceback (most recent call last):\nRuntimeError: terminated"
            )
            self.signals.append(signum)
            self.code = 1
            return
        super().signal(signum)


def test_an_exception_raised_after_the_stops_sigterm_is_the_stop_not_a_cause(
    worker: Worker, server: FakeServer, launcher: Launcher
) -> None:
    launcher.groups[1] = RaisesOnSigterm(folder=run_dir(launcher))
    server.responses += [
        PollResponse(start=[assignment()], stop=[]),
        PollResponse(start=[], stop=[1]),
    ]
    worker.step()
    worker.step()  # told to stop: SIGTERM
    until(lambda: not worker.parts, worker)
    assert launcher.groups[1].signals == [signal.SIGTERM]
    assert (run_dir(launcher) / "rank-0.failed").exists()  # it did raise
    assert finished(server).status == "cancelled"


def ask(part_id: int, grace_s: float) -> StopRequest:
    return StopRequest(
        part_id=part_id, reason=StopReason.PREEMPTED, detail="by job 9", grace_s=grace_s
    )


def test_a_part_asked_to_stop_at_a_step_is_told_through_its_run_dir_and_reports_stopped(
    worker: Worker, server: FakeServer, launcher: Launcher
) -> None:
    server.responses += [
        PollResponse(start=[assignment()], stop=[]),
        PollResponse(start=[], stop=[], checkpoint_and_stop=[ask(1, 600)]),
    ]
    worker.step()
    folder = run_dir(launcher, 1, 0)
    assert not runfiles.stop_requested(folder)
    worker.step()
    assert runfiles.stop_requested(folder)  # the ranks look for it when they agree
    worker.step()
    assert server.asked_to_stop == [1]  # the next poll says it knows: no news again
    assert launcher.groups[1].signals == []  # nothing is signalled within the grace
    # The ranks stopped at step 7 of epoch 2 and rank 0 checkpointed there.
    (folder / "checkpoint-epoch-2-step-7.pt").write_bytes(b"state")
    runfiles.write_outcome(folder, runfiles.Outcome(status="stopped", exit_code=0))
    launcher.groups[1].exit(0)
    until(lambda: not worker.parts, worker)
    assert ("checkpoint", (2, 7)) in server.calls  # before the finish
    finish = finished(server)
    assert (finish.status, finish.step, finish.exit_code) == ("stopped", 7, 0)


def test_ranks_that_do_not_stop_at_a_step_by_the_deadline_are_signalled(
    worker: Worker, server: FakeServer, launcher: Launcher
) -> None:
    launcher.groups[1] = FakeGroup(survives_sigterm=True)
    server.responses += [
        PollResponse(start=[assignment()], stop=[]),
        PollResponse(start=[], stop=[], checkpoint_and_stop=[ask(1, 0)]),
    ]
    worker.step()
    worker.step()  # asked, with no time left: SIGTERM, then SIGKILL after the grace
    until(lambda: not worker.parts, worker)
    assert launcher.groups[1].signals == [signal.SIGTERM, signal.SIGKILL]
    assert finished(server).status == "cancelled"


def test_a_stop_for_a_part_this_node_never_ran_is_confirmed(
    worker: Worker, server: FakeServer
) -> None:
    server.responses.append(PollResponse(start=[], stop=[42]))
    worker.step()
    assert finished(server).status == "cancelled"


def test_machine_0_publishes_its_port_and_the_others_wait_for_it(
    worker: Worker, server: FakeServer, launcher: Launcher
) -> None:
    server.responses += [
        PollResponse(start=[assignment(1, 0), assignment(2, 1)], stop=[]),
    ]
    worker.step()
    assert worker.parts[1].state is PartState.LAUNCHED
    runfiles.write_rendezvous(run_dir(launcher, 1, 0), 29500)  # machine 0's launcher bound it
    worker.step()
    assert ("rendezvous", 29500) in server.calls
    assert worker.parts[1].state is PartState.RUNNING
    assert server.calls[-1] == ("poll", ([1, 2], [2]))  # machine 1 still waits for its port
    server.responses.append(
        PollResponse(start=[], stop=[], rendezvous=[Rendezvous(part_id=2, master_port=29500)])
    )
    worker.step()
    assert runfiles.read_rendezvous(run_dir(launcher, 2, 1)) == 29500
    assert worker.parts[2].state is PartState.RUNNING


def test_a_launcher_that_dies_without_an_outcome_is_reported_as_such(
    worker: Worker, server: FakeServer, launcher: Launcher
) -> None:
    server.responses.append(PollResponse(start=[assignment()], stop=[]))
    worker.step()
    launcher.groups[1].exit(-9)
    until(lambda: not worker.parts, worker)
    finish = finished(server)
    assert finish.reason is FailureReason.LAUNCHER_DIED
    assert "killed by SIGKILL" in finish.message


def test_a_poll_the_server_holds_counts_as_contact_and_a_failed_one_does_not(
    worker: Worker, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heartbeat thread beats only when the server has had no poll from
    the daemon for an interval (worker/heartbeat.py): a long-poll it holds
    open is contact, a poll that never reached it is not."""
    seen_while_held: list[float] = []
    answer = server.poll

    def held_poll(*args: Any, **kwargs: Any) -> PollResponse:
        seen_while_held.append(worker._polled_at())
        return answer(*args, **kwargs)

    before = time.monotonic()
    monkeypatch.setattr(server, "poll", held_poll)
    worker.step()
    assert seen_while_held and seen_while_held[0] >= before  # held: contact since it was sent
    answered = worker._polled_at()
    assert answered >= seen_while_held[0]
    server.down.add("poll")
    worker.step()
    assert worker._polled_at() == answered  # the failed poll is no contact


def test_a_training_part_is_polled_for_by_the_time_its_training_should_end(
    worker: Worker, server: FakeServer, launcher: Launcher
) -> None:
    """The daemon holds its poll for a report interval while a part trains,
    but comes back when rank 0's pace says training ends: the part's end
    is then reported at once, not up to an interval later."""
    server.responses.append(PollResponse(start=[assignment()], stop=[]))
    worker.step()
    runfiles.write_rendezvous(run_dir(launcher), 29500)  # the launcher is up
    interval = worker.settings.report_interval_s
    now = datetime.now(timezone.utc)

    def report(seq: int, batch: int, at: datetime) -> None:
        line = ProgressReport(seq=seq, epoch=1, batch=batch, batches_per_epoch=100, loss=0.1, at=at)
        with open(run_dir(launcher) / runfiles.PROGRESS, "a", encoding="utf-8") as out:
            out.write(line.model_dump_json() + "\n")

    # Ten batches a second, 50 of 100 done: five seconds to go.
    report(0, 40, now - timedelta(seconds=1))
    report(1, 50, now)
    worker.step()
    assert server.waits[-1] == interval
    # 86 then 96 done a second apart: 0.4 s to go, less the time since.
    now = datetime.now(timezone.utc)
    report(2, 86, now - timedelta(seconds=1))
    report(3, 96, now)
    worker.step()
    assert FINISHING_CHECK_S <= server.waits[-1] <= 0.4
    # Late by its own pace: back at once, then every FINISHING_CHECK_S.
    report(4, 88, now - timedelta(seconds=2))
    report(5, 98, now - timedelta(seconds=1))
    worker.step()
    assert server.waits[-1] == FINISHING_CHECK_S
