"""``python -m worker.launcher RUN_DIR``: run one part (one machine id of a
job) as ``mp.spawn(run_rank, nprocs=P)`` and record how it ended.

The daemon starts this in a new session, so it can stop the launcher and
every rank with one signal to the process group. Run it by hand on a
launch.json to train without the server (the benchmark does).
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

from worker import runfiles, trainers
from worker._process import die_with_parent

TRACEBACK_TAIL_CHARS = 4000

# What a rank sees when another rank of the job died first: its failure is a
# consequence, and the server keeps looking for the cause.
PEER_FAILURE_SIGNS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "NCCL communicator was aborted",
)


def _classify(traceback_text: str) -> str:
    return "peer_failure" if any(s in traceback_text for s in PEER_FAILURE_SIGNS) else "rank_failed"


def _tail(text: str) -> str:
    return text[-TRACEBACK_TAIL_CHARS:].strip()


def _could_not(step: str, machine_id: int, exc: Exception) -> runfiles.Outcome:
    """A failure of the launcher itself, before any rank ran (call in ``except``)."""
    return runfiles.Outcome(
        status="failed",
        reason=f"{step}_failed",
        message=f"machine {machine_id} could not {step}: {exc}",
        exit_code=1,
        traceback_tail=_tail(traceback.format_exc()),
    )


class RendezvousTimeout(RuntimeError):
    pass


def host_store(config: runfiles.LaunchConfig) -> tuple[Any, int]:
    """Machine 0: bind the job's TCPStore on a port the OS picks (so it is
    free on this host, whatever else runs here) and publish the port.

    The launcher hosts it, like torchrun's agent: every rank joins as a
    client (TORCHELASTIC_USE_AGENT_STORE), so rank 0 need not bind anything.
    """
    from torch.distributed import TCPStore

    store = TCPStore(
        host_name=config.assignment.master_addr,
        port=0,
        world_size=None,
        is_master=True,
        timeout=timedelta(seconds=config.process_group_timeout_s),
        wait_for_workers=False,
    )
    runfiles.write_rendezvous(config.run_dir, store.port)
    return store, store.port


def await_port(config: runfiles.LaunchConfig, poll_s: float = 0.05) -> int:
    """Other machines: the daemon writes the port once the server has it."""
    deadline = time.monotonic() + config.process_group_timeout_s
    while (port := runfiles.read_rendezvous(config.run_dir)) is None:
        if time.monotonic() > deadline:
            raise RendezvousTimeout(
                f"machine 0 did not publish a rendezvous port within "
                f"{config.process_group_timeout_s:.0f} s"
            )
        time.sleep(poll_s)
    return port


def launch(config: runfiles.LaunchConfig) -> runfiles.Outcome:
    assignment = config.assignment
    processes = config.local_processes
    try:
        trainer = trainers.resolve(assignment.spec.trainer, config.trainers)
        if trainer.prepare is not None:
            trainer.prepare(config.data_dir)
    except Exception as exc:
        return _could_not("prepare", assignment.machine_id, exc)

    import torch.multiprocessing as mp

    from worker.rank import run_rank

    try:
        if assignment.machine_id == 0:
            # The store lives as long as this frame, that is until the ranks exit.
            store, port = host_store(config)
        else:
            store, port = None, await_port(config)
    except Exception as exc:
        return _could_not("rendezvous", assignment.machine_id, exc)

    first_rank = assignment.machine_id * processes
    try:
        assert store is not None or assignment.machine_id > 0
        mp.spawn(run_rank, args=(config, os.getpid(), port), nprocs=processes, join=True)
    except mp.ProcessRaisedException as exc:
        rank = first_rank + exc.error_index
        reason = _classify(exc.msg)
        what = "lost a peer" if reason == "peer_failure" else "raised an exception"
        return runfiles.Outcome(
            status="failed",
            reason=reason,
            message=f"rank {rank} (machine {assignment.machine_id}) {what}",
            failing_rank=rank,
            exit_code=1,
            traceback_tail=_tail(exc.msg),
        )
    except mp.ProcessExitedException as exc:
        rank = first_rank + exc.error_index
        how = (
            f"was killed by {exc.signal_name}"
            if exc.signal_name
            else f"exited with code {exc.exit_code}"
        )
        return runfiles.Outcome(
            status="failed",
            reason="rank_exited",
            message=f"rank {rank} (machine {assignment.machine_id}) {how}",
            failing_rank=rank,
            exit_code=exc.exit_code,
        )
    return runfiles.Outcome(status="succeeded", exit_code=0)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m worker.launcher RUN_DIR", file=sys.stderr)
        return 2
    config = runfiles.read_launch(Path(args[0]))
    die_with_parent(config.parent_pid, sig=15)
    outcome = launch(config)
    runfiles.write_outcome(config.run_dir, outcome)
    if outcome.status == "failed":
        print(outcome.message, file=sys.stderr, flush=True)
    return 0 if outcome.status == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
