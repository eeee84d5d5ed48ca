"""One part of a torchrun-style script job: each local rank runs the script
in a fresh interpreter, with the environment torchrun gives its workers, and
the first rank to fail decides how the part ends (the others are stopped,
as torchrun's agent does).

Machine 0's launcher hosts the job's store as for built-in trainers, so a
script's ``init_process_group("gloo")`` (env://) joins it as a client.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import ddpo
from ddpo.failures import FailureReason
from worker import causes, launcher, network, rank, rank_env, runfiles, scripts
from worker.unpack import unpack_checkpoint

# How often the launcher looks at its ranks; and how long a rank stopped
# because another failed has to exit before SIGKILL.
POLL_S = 0.05
STOP_GRACE_S = 5.0
# How long a rank that lost a peer waits for the peer's own failure: the
# other ranks of this machine either raised (and are exiting: seconds on a
# busy host) or lost the same peer (and exit as fast as this one did).
CAUSE_GRACE_S = 30.0
# torch prefixes what a rank prints to stderr with "[rankN]: ".
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")
# An exception's last line: its (qualified) class name, then its message.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?::\s|$)")
# What the C++ runtime prints when a library's teardown calls std::terminate
# (a joinable thread destroyed at exit, an exception out of a destructor)
# before it aborts: seen after a rank's own traceback when its peer still
# waited in a collective (gloo, 5 of 60 runs on a busy host).
_NATIVE_TEARDOWN = re.compile(
    r"^(terminate called (after throwing an instance of .*|without an active exception"
    r"|recursively)|\s+what\(\):.*|Exception raised from .*|frame #\d+:.*)$"
)


def run(config: runfiles.LaunchConfig) -> runfiles.Outcome:
    assignment = config.assignment
    ref = assignment.spec.script
    assert ref is not None
    try:
        path = scripts.locate(config.script_dir, ref)
        checkpoint_dir = _checkpoint_dir(config)
    except (scripts.ScriptUnavailable, OSError, tarfile.TarError) as exc:
        return launcher.could_not(
            "prepare", FailureReason.PREPARE_FAILED, assignment.machine_id, exc
        )
    try:
        # The store lives as long as this frame, that is until the ranks exit.
        store = launcher.host_store(config) if assignment.machine_id == 0 else None
        master_port = runfiles.await_rendezvous(config.run_dir, config.process_group_timeout_s)
    except Exception as exc:
        return launcher.could_not(
            "rendezvous", FailureReason.RENDEZVOUS_FAILED, assignment.machine_id, exc
        )
    ranks = [
        _start(config, path, local_rank, master_port, checkpoint_dir)
        for local_rank in range(config.local_processes)
    ]
    try:
        return _supervise(config, ranks)
    finally:
        _stop(config.run_dir, ranks)
        del store


def torchrun_env(
    config: runfiles.LaunchConfig, local_rank: int, master_port: int
) -> dict[str, str]:
    """The variables torchrun sets for a worker process, for this rank."""
    assignment = config.assignment
    spec = assignment.spec
    global_rank = assignment.rank_of(local_rank)
    return {
        "MASTER_ADDR": assignment.master_addr,
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(assignment.world_size),
        "RANK": str(global_rank),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(spec.topology.num_processes),
        "GROUP_RANK": str(assignment.machine_id),
        "GROUP_WORLD_SIZE": str(spec.topology.num_machines),
        "ROLE_NAME": "default",
        "ROLE_RANK": str(global_rank),
        "ROLE_WORLD_SIZE": str(assignment.world_size),
        "TORCHELASTIC_RESTART_COUNT": str(assignment.restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
        "TORCHELASTIC_RUN_ID": f"ddpo-job-{assignment.job_id}",
        # Machine 0's launcher hosts the store; every rank is its client.
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "OMP_NUM_THREADS": str(rank.threads_for(config)),
        **rank_env.tracking(assignment),
    }


def _checkpoint_dir(config: runfiles.LaunchConfig) -> Path:
    """This machine's DDPO_CHECKPOINT_DIR; on a retry, the job's last saved
    checkpoint put back in it."""
    directory = config.run_dir / runfiles.CHECKPOINT_DIR
    directory.mkdir(parents=True, exist_ok=True)
    if config.resume_from is not None:
        unpack_checkpoint(config.resume_from, directory)
    return directory


def _start(
    config: runfiles.LaunchConfig, path: Path, local_rank: int, master_port: int, checkpoint: Path
) -> subprocess.Popen[bytes]:
    assignment = config.assignment
    ref = assignment.spec.script
    assert ref is not None
    env = {
        **os.environ,
        **torchrun_env(config, local_rank, master_port),
        **network.collective_env(config.interface, os.environ),
        ddpo.RUN_DIR_ENV: str(config.run_dir),
        ddpo.CHECKPOINT_DIR_ENV: str(checkpoint),
        ddpo.PRECISION_ENV: assignment.spec.performance.precision,
        "PYTHONUNBUFFERED": "1",
    }
    for name, value in (
        (ddpo.RESUME_EPOCH_ENV, assignment.resume_epoch),
        (ddpo.RESUME_STEP_ENV, assignment.resume_step),
    ):
        if value is not None:
            env[name] = str(value)
        else:
            env.pop(name, None)
    log_path = runfiles.rank_log(config.run_dir, assignment.rank_of(local_rank))
    with open(log_path, "ab") as output:
        # In the launcher's process group: the daemon's one signal reaches it.
        return subprocess.Popen(
            [sys.executable, "-m", "worker.script_rank", str(path), *ref.args],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=config.run_dir,
            env=env,
        )


def _supervise(
    config: runfiles.LaunchConfig, ranks: list[subprocess.Popen[bytes]]
) -> runfiles.Outcome:
    """Wait for every rank; the first to fail ends the part. A rank that
    only saw a peer go away yields to one that failed by itself: the peer
    that raised may still be exiting (its sockets close before its process
    is gone), so it is given CAUSE_GRACE_S to show up."""
    symptom_at: float | None = None
    while True:
        codes = [process.poll() for process in ranks]
        outcomes = [
            _failure(config, index, code)
            for index, code in enumerate(codes)
            if code is not None and code != 0
        ]
        causes = [o for o in outcomes if o.reason is not FailureReason.PEER_FAILURE]
        if causes:
            return causes[0]
        if outcomes:
            symptom_at = symptom_at or time.monotonic()
            still_running = any(code is None for code in codes)
            if not still_running or time.monotonic() - symptom_at >= CAUSE_GRACE_S:
                return outcomes[0]
        elif all(code == 0 for code in codes):
            # Every rank agreed to stop (ddpo.should_stop) and exited.
            stopped = runfiles.stopped(config.run_dir)
            return runfiles.Outcome(status="stopped" if stopped else "succeeded", exit_code=0)
        time.sleep(POLL_S)


def _failure(config: runfiles.LaunchConfig, local_rank: int, code: int) -> runfiles.Outcome:
    assignment = config.assignment
    global_rank = assignment.rank_of(local_rank)
    tail = _tail(runfiles.rank_log(config.run_dir, global_rank))
    reason, what = _judged(code, tail)
    return runfiles.Outcome(
        status="failed",
        reason=reason,
        message=f"rank {global_rank} (machine {assignment.machine_id}) {what}",
        failing_rank=global_rank,
        exit_code=code,
        traceback_tail=tail or None,
    )


def _judged(code: int, tail: str) -> tuple[FailureReason, str]:
    """Why a rank that ended with ``code`` (negative: the signal) failed,
    from what it printed last, and that in words."""
    reason = causes.classify(tail)
    if code < 0:
        signal_name = signal.Signals(-code).name
        if _raised_last(tail) and reason is FailureReason.RANK_FAILED:
            # Its own exception ended it; a signal while it exited (a crash
            # in a library's teardown) does not make that the machine's fault.
            return reason, f"raised, then was killed by {signal_name} exiting"
        # Killed: by the OOM killer, an operator, a lost machine. Retryable.
        return FailureReason.RANK_EXITED, f"was killed by {signal_name}"
    # The script ended itself non-zero (an exception exits 1): its own doing,
    # unless what it printed says a peer went away first.
    what = {
        FailureReason.PEER_FAILURE: "lost a peer",
        FailureReason.RENDEZVOUS_FAILED: "could not rendezvous",
    }.get(reason, f"exited with code {code}")
    return reason, what


def _raised_last(tail: str) -> bool:
    """Whether what the rank printed ends with an uncaught exception's
    traceback (Python prints it on the way out): after its last
    "Traceback" line come only frames (indented) and the exception's line,
    save what a native crash in the interpreter's teardown printed after it."""
    lines = [_RANK_PREFIX.sub("", line) for line in tail.strip().splitlines()]
    while lines and _NATIVE_TEARDOWN.match(lines[-1]):
        lines.pop()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call")]
    if not starts:
        return False
    after = lines[starts[-1] + 1 :]
    return (
        len(after) >= 2
        and all(line.startswith(" ") for line in after[:-1])
        and _EXCEPTION_LINE.match(after[-1]) is not None
    )


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - causes.TRACEBACK_TAIL_CHARS))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _stop(run_dir: Path, ranks: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to the ranks still running, SIGKILL after the grace period."""
    alive = [process for process in ranks if process.poll() is None]
    if alive:
        runfiles.request_termination(run_dir)  # meant: their shield lets it through
    for process in alive:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for process in alive:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
