"""The run directory: the file contract between the daemon and the processes
it launches for one part.

The daemon writes ``launch.json``, and ``rendezvous.json`` on machines other
than 0 once the server knows the port; machine 0's launcher writes
``rendezvous.json`` when it has bound the job's store. The launcher and its
ranks write
``progress.jsonl`` (rank 0, appended), ``result.json`` (rank 0, at the end)
and ``outcome.json`` (the launcher, how the part ended); each rank's stdout
and stderr go to ``rank-N.log`` (N its global rank), the launcher's to
``output.log``; rank 0 adds ``checkpoint-epoch-N.pt`` files.
Files survive crashes, so the daemon can always tell what happened, and
progress lines arrive in order.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from ddpo.failures import FailureReason
from ddpo.schemas import MAX_LOG_LINE_CHARS, Assignment, LogLine, ProgressReport, TrainResult
from worker import cores

LAUNCH = "launch.json"
PROGRESS = "progress.jsonl"
RESULT = "result.json"
OUTCOME = "outcome.json"
OUTPUT = "output.log"
RENDEZVOUS = "rendezvous.json"
# Written by the daemon when the server asks the part to stop at a step;
# the ranks look for it when they agree (worker/stopping.py).
STOP_REQUEST = "stop-request.json"
# ... and by the ranks (local rank 0) once they all stopped at a step.
STOPPED = "stopped"
# Written by the daemon just before it sends SIGTERM to a part's processes:
# the SIGTERM is then its own, not one sent to every process (worker/shield.py).
TERMINATE = "terminate"
# A script's checkpoint directory (DDPO_CHECKPOINT_DIR), per machine.
CHECKPOINT_DIR = "checkpoint"
RANK_LOG = re.compile(r"^rank-(\d+)\.log$")
# Written by a rank whose training (or script) raised, before it leaves the
# process group or exits (which is when its peers notice): the cause
# survives a stop signal that lands before its launcher could record it.
RANK_FAILURE = re.compile(r"^rank-(\d+)\.failed$")


def rank_log(run_dir: Path, rank: int) -> Path:
    return run_dir / f"rank-{rank}.log"


def capture_output(run_dir: Path, rank: int) -> None:
    """Send this process's stdout and stderr (its Python prints and anything
    C++ writes) to its rank's log."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(rank_log(run_dir, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


class LaunchConfig(BaseModel):
    """Everything the launcher needs, so it reads no settings of its own."""

    assignment: Assignment
    run_dir: Path
    data_dir: Path
    trainers: dict[str, str] = Field(default_factory=dict)
    process_group_timeout_s: float
    parent_pid: int
    resume_from: Path | None = Field(None, description="A checkpoint to continue from")
    script_dir: Path | None = Field(None, description="Where the scripts jobs name are")
    interface: str | None = Field(
        None, description="The network interface the ranks' collectives bind and advertise"
    )
    cpus: int = Field(
        default_factory=cores.usable_cpus, ge=1, description="Cores this node's ranks share"
    )
    rank_env: list[str] = Field(
        default_factory=list, description="Variables the ranks get besides the allow-list"
    )
    hidden: list[Path] = Field(
        default_factory=list,
        description="Files the ranks must not read (the node's credential): masked where "
        "the launcher may make a mount namespace",
    )
    extensions_dir: Path | None = Field(
        None, description="Where the node's compiled kernels are (worker/fused_pool.py)"
    )

    @property
    def local_processes(self) -> int:
        return self.assignment.spec.topology.num_processes


class Outcome(BaseModel):
    status: Literal["succeeded", "failed", "stopped"]
    reason: FailureReason | None = None
    message: str | None = None
    failing_rank: int | None = None
    exit_code: int | None = None
    traceback_tail: str | None = None


def write_atomically(path: Path, text: str) -> None:
    """Readers see the old file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_launch(config: LaunchConfig) -> None:
    config.run_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(config.run_dir / LAUNCH, config.model_dump_json(indent=2))


def read_launch(run_dir: Path) -> LaunchConfig:
    return LaunchConfig.model_validate_json((run_dir / LAUNCH).read_text())


def write_rendezvous(run_dir: Path, master_port: int) -> None:
    write_atomically(run_dir / RENDEZVOUS, json.dumps({"master_port": master_port}))


def read_rendezvous(run_dir: Path) -> int | None:
    try:
        port: int = json.loads((run_dir / RENDEZVOUS).read_text())["master_port"]
    except FileNotFoundError:
        return None
    return port


class RendezvousTimeout(RuntimeError):
    pass


def await_rendezvous(run_dir: Path, timeout_s: float, poll_s: float = 0.02) -> int:
    """The port of the job's store: machine 0's launcher writes it once bound;
    on other machines the daemon writes it once the server has it."""
    deadline = time.monotonic() + timeout_s
    while (port := read_rendezvous(run_dir)) is None:
        if time.monotonic() > deadline:
            raise RendezvousTimeout(f"no rendezvous port from machine 0 within {timeout_s:.0f} s")
        time.sleep(poll_s)
    return port


def write_result(run_dir: Path, result: TrainResult) -> None:
    write_atomically(run_dir / RESULT, result.model_dump_json())


def read_result(run_dir: Path) -> TrainResult | None:
    path = run_dir / RESULT
    return TrainResult.model_validate_json(path.read_text()) if path.exists() else None


def write_rank_failure(run_dir: Path, rank: int, traceback_text: str) -> None:
    write_atomically(run_dir / f"rank-{rank}.failed", traceback_text)


def rank_failures(run_dir: Path) -> dict[int, str]:
    """The tracebacks of the ranks that raised, by rank; only those written
    before the daemon's SIGTERM was meant for the part: a script's own
    SIGTERM handler may raise, and that exception is the stop, not a cause."""
    try:
        signalled_at: int | None = (run_dir / TERMINATE).stat().st_mtime_ns
    except FileNotFoundError:
        signalled_at = None
    found: dict[int, str] = {}
    with contextlib.suppress(FileNotFoundError):
        for path in run_dir.iterdir():
            if (match := RANK_FAILURE.match(path.name)) is None:
                continue
            with contextlib.suppress(FileNotFoundError):
                # Strictly before: file times move in ticks of a few ms, and a
                # handler's exception can come within the same tick.
                if signalled_at is None or path.stat().st_mtime_ns < signalled_at:
                    found[int(match.group(1))] = path.read_text(errors="replace")
    return dict(sorted(found.items()))


def write_outcome(run_dir: Path, outcome: Outcome) -> None:
    write_atomically(run_dir / OUTCOME, outcome.model_dump_json())


def read_outcome(run_dir: Path) -> Outcome | None:
    path = run_dir / OUTCOME
    return Outcome.model_validate_json(path.read_text()) if path.exists() else None


CHECKPOINT = re.compile(r"^checkpoint-epoch-(\d+)\.pt$")


def checkpoint_path(run_dir: Path, epoch: int) -> Path:
    """Named by epoch and never rewritten: a reader gets the epoch the name says."""
    return run_dir / f"checkpoint-epoch-{epoch}.pt"


STOP_CHECKPOINT = re.compile(r"^checkpoint-epoch-(\d+)-step-(\d+)\.pt$")


def stop_checkpoint_path(run_dir: Path, epoch: int, step: int) -> Path:
    """A checkpoint taken where a job was asked to stop, within ``epoch``:
    named by it and by its step (the batches every rank has trained)."""
    return run_dir / f"checkpoint-epoch-{epoch}-step-{step}.pt"


def checkpoints(run_dir: Path) -> list[tuple[Path, int]]:
    """The complete checkpoints of whole epochs in the run directory, oldest first."""
    found = []
    for entry in run_dir.iterdir() if run_dir.exists() else []:
        match = CHECKPOINT.match(entry.name)
        if match:
            found.append((entry, int(match.group(1))))
    return sorted(found, key=lambda pair: pair[1])


def latest_checkpoint(run_dir: Path) -> tuple[Path, int] | None:
    found = checkpoints(run_dir)
    return found[-1] if found else None


@dataclass(frozen=True)
class Saved:
    """A checkpoint file: after ``epoch``, or (a stop's) after ``step`` within it."""

    path: Path
    epoch: int
    step: int | None = None

    def order(self) -> tuple[int, int]:
        """Later positions sort later (as the server orders them)."""
        if self.step is None:
            return (self.epoch, -1)
        return (self.epoch - 1, self.step)


def newest_saved(run_dir: Path) -> Saved | None:
    """The newest checkpoint in the run directory, of an epoch or a stop's."""
    return max(_all_saved(run_dir), key=Saved.order, default=None)


def _all_saved(run_dir: Path) -> list[Saved]:
    found = [Saved(path, epoch) for path, epoch in checkpoints(run_dir)]
    for entry in run_dir.iterdir() if run_dir.exists() else []:
        match = STOP_CHECKPOINT.match(entry.name)
        if match:
            found.append(Saved(entry, int(match.group(1)), int(match.group(2))))
    return found


def drop_older_checkpoints(run_dir: Path, newest: Path) -> None:
    """Delete the checkpoints taken before ``newest`` (just written): only
    the newest is ever uploaded or resumed from."""
    saved = {s.path: s for s in _all_saved(run_dir)}
    if newest not in saved:
        return
    for path, older in saved.items():
        if older.order() < saved[newest].order():
            path.unlink(missing_ok=True)


def request_stop(run_dir: Path, reason: str, detail: str | None) -> None:
    """The daemon's word to the ranks: stop at the next agreed step."""
    write_atomically(run_dir / STOP_REQUEST, json.dumps({"reason": reason, "detail": detail}))


def stop_requested(run_dir: Path) -> bool:
    return (run_dir / STOP_REQUEST).exists()


def request_termination(run_dir: Path) -> None:
    """Said before the daemon's SIGTERM to the part: that one is meant.
    Unsaid (the directory gone), the SIGKILL after the grace period ends it."""
    with contextlib.suppress(OSError):
        (run_dir / TERMINATE).touch()


def termination_requested(run_dir: Path) -> bool:
    return (run_dir / TERMINATE).exists()


def write_stopped(run_dir: Path) -> None:
    write_atomically(run_dir / STOPPED, "")


def stopped(run_dir: Path) -> bool:
    return (run_dir / STOPPED).exists()


class ProgressWriter:
    """Rank 0's side: one JSON line per report, flushed at once (cheap: a
    report goes out every few batches, not every batch)."""

    def __init__(self, run_dir: Path) -> None:
        self._file = open(run_dir / PROGRESS, "a", encoding="utf-8")  # noqa: SIM115
        self._seq = 0

    def __call__(
        self,
        *,
        epoch: int,
        batch: int,
        batches_per_epoch: int,
        loss: float | None,
        samples_per_sec: float | None,
        step: int | None = None,
        metrics: dict[str, float | None] | None = None,
        epochs: int | None = None,
    ) -> None:
        report = ProgressReport(
            seq=self._seq,
            step=step,
            epoch=epoch,
            batch=batch,
            batches_per_epoch=batches_per_epoch,
            loss=loss,
            samples_per_sec=samples_per_sec,
            metrics=metrics or {},
            epochs=epochs,
            at=datetime.now(timezone.utc),
        )
        self._file.write(report.model_dump_json() + "\n")
        self._file.flush()
        self._seq += 1

    def close(self) -> None:
        self._file.close()


class ProgressReader:
    """The daemon's side: returns the complete lines added since last time."""

    def __init__(self, run_dir: Path) -> None:
        self._path = run_dir / PROGRESS
        self._offset = 0

    def read_new(self) -> list[ProgressReport]:
        try:
            with open(self._path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self._offset += end + 1
        return [
            ProgressReport.model_validate(json.loads(line))
            for line in chunk[: end + 1].splitlines()
            if line.strip()
        ]


class LogReader:
    """The daemon's side of the logs: the lines added to each rank's log and
    to the launcher's since last time, at most ``max_bytes`` a call."""

    def __init__(self, run_dir: Path, max_bytes: int = 256 * 1024) -> None:
        self._run_dir = run_dir
        self._offsets: dict[str, int] = {}
        self._max_bytes = max_bytes

    def _sources(self) -> list[tuple[Path, int | None]]:
        found: list[tuple[Path, int | None]] = [(self._run_dir / OUTPUT, None)]
        try:
            entries = list(self._run_dir.iterdir())
        except FileNotFoundError:
            return []
        for entry in sorted(entries):
            match = RANK_LOG.match(entry.name)
            if match:
                found.append((entry, int(match.group(1))))
        return found

    def read_new(self, *, final: bool = False) -> list[LogLine]:
        """Complete lines; with ``final`` (the processes are gone) also a last
        line without its newline."""
        now = datetime.now(timezone.utc)
        lines: list[LogLine] = []
        budget = self._max_bytes
        for path, rank in self._sources():
            if budget <= 0:
                break
            start = self._offsets.get(path.name, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(start)
                    chunk = f.read(budget)
            except FileNotFoundError:
                continue
            end = chunk.rfind(b"\n") + 1
            if final or (end == 0 and len(chunk) == budget):
                end = len(chunk)  # the last words, or one line longer than the budget
            if end == 0:
                continue
            budget -= end
            offset = start
            for raw in chunk[:end].splitlines(keepends=True):
                # NUL is a byte a program may print but no database stores.
                text = (
                    raw.rstrip(b"\r\n").decode("utf-8", errors="replace").replace("\x00", "\ufffd")
                )
                if len(text) > MAX_LOG_LINE_CHARS:
                    text = text[:MAX_LOG_LINE_CHARS] + " [line cut]"
                lines.append(LogLine(rank=rank, offset=offset, text=text, at=now))
                offset += len(raw)
            self._offsets[path.name] = start + end
        return lines
