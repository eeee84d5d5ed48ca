"""``python -m worker.launcher RUN_DIR``: run one part (one machine id of a
job) as ``mp.spawn(run_rank, nprocs=P)`` and record how it ended.

The daemon forks it from its fork server (``worker/forkserver.py``: torch
already imported) or, without one, starts it as a command; either way in a
new session, so one signal to the process group stops the launcher and every
rank. Run it by hand on a launch.json to train without the server (the
benchmark does).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from ddpo.failures import FailureReason
from ddpo.schemas.protocol import TrainerOffer
from worker import cpu_features, fused_pool, rank_env, runfiles, shield, trainers
from worker._process import die_with_parent, hide_files, keep_freed_memory
from worker.causes import classify, tail
from worker.local_allreduce import LocalGroup


def could_not(
    step: str, reason: FailureReason, machine_id: int, exc: Exception
) -> runfiles.Outcome:
    """A failure of the launcher itself, before any rank ran (call in ``except``)."""
    return runfiles.Outcome(
        status="failed",
        reason=reason,
        message=f"machine {machine_id} could not {step}: {exc}",
        exit_code=1,
        traceback_tail=tail(traceback.format_exc()),
    )


def host_store(config: runfiles.LaunchConfig) -> Any:
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
    return store


def same_host_group(config: runfiles.LaunchConfig) -> LocalGroup | None:
    """Shared-memory gradient averaging, when every rank is on this host."""
    spec = config.assignment.spec
    if (
        spec.topology.num_machines > 1
        or spec.topology.num_processes == 1
        or spec.backend != "gloo"
        or spec.performance.same_host_allreduce != "shared_memory"
    ):
        return None
    import multiprocessing

    shm = Path("/dev/shm")
    folder = shm if shm.is_dir() and os.access(shm, os.W_OK) else config.run_dir
    return LocalGroup(
        barrier=multiprocessing.get_context(spec.performance.start_method).Barrier(
            spec.topology.num_processes
        ),
        path=folder / f"ddpo-{os.getpid()}-job{config.assignment.job_id}.gradients",
        timeout_s=config.process_group_timeout_s,
    )


@contextlib.contextmanager
def _no_thread_pool() -> Iterator[None]:
    """Run torch work in this thread alone. The ranks are forked after it, and
    a process forked from one whose OpenMP thread pool was started hangs in
    its first parallel region (GNU OpenMP's pool does not survive fork;
    DataLoader workers set 1 thread for the same reason). With one thread,
    torch never starts the pool."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def launch(config: runfiles.LaunchConfig) -> runfiles.Outcome:
    assignment = config.assignment
    slow = cpu_features.slow_precision(
        assignment.spec.performance.precision, assignment.spec.backend, cpu_features.flags()
    )
    if slow is not None:
        print(slow, flush=True)
    if assignment.spec.script is not None:
        from worker import script_launch

        return script_launch.run(config)
    if assignment.spec.performance.keep_freed_memory:
        keep_freed_memory()
    if assignment.spec.performance.fused_pool:
        # Loaded here, the ranks forked from here have it (a spawned rank
        # loads it itself); the trainer's prepare can say which ran.
        fused_pool.load(config.extensions_dir)
    else:
        fused_pool.disable("performance.fused_pool is off")
    try:
        trainer = trainers.resolve(assignment.spec.trainer, config.trainers)
        trainer.params_of(assignment.spec)  # refused here, before any rank starts
        if trainer.prepare is not None:
            with _no_thread_pool():
                trainer.prepare(config.data_dir, assignment.spec)
    except Exception as exc:
        return could_not("prepare", FailureReason.PREPARE_FAILED, assignment.machine_id, exc)

    local_group = same_host_group(config)
    try:
        return _run_ranks(config, local_group)
    finally:
        if local_group is not None:
            local_group.path.unlink(missing_ok=True)  # if rank 0 did not get to it


def _run_ranks(config: runfiles.LaunchConfig, local_group: LocalGroup | None) -> runfiles.Outcome:
    import torch.multiprocessing as mp

    from worker.rank import run_rank

    assignment = config.assignment
    processes = config.local_processes
    # Ranks first, then the store: a forked rank must not inherit the store's
    # server thread. The ranks wait for the port the store publishes.
    ranks = mp.start_processes(
        run_rank,
        args=(config, os.getpid(), local_group),
        nprocs=processes,
        join=False,
        start_method=assignment.spec.performance.start_method,
    )
    for process in ranks.processes:
        # torch's join sends SIGTERM to the ranks left when one fails (and
        # so do we, below): said first, so their shield lets it through.
        process.terminate = _said_first(process.terminate, config.run_dir)
    try:
        # The store lives as long as this frame, that is until the ranks exit.
        store = host_store(config) if assignment.machine_id == 0 else None
    except Exception as exc:
        for process in ranks.processes:
            process.terminate()
        with contextlib.suppress(Exception):
            ranks.join()
        return could_not("rendezvous", FailureReason.RENDEZVOUS_FAILED, assignment.machine_id, exc)

    try:
        while not ranks.join():
            pass
    except mp.ProcessRaisedException as exc:
        index, text = _the_cause(ranks, exc.error_index, exc.msg)
        rank = assignment.rank_of(index)
        reason = classify(text)
        what = {
            FailureReason.PEER_FAILURE: "lost a peer",
            FailureReason.RENDEZVOUS_FAILED: "could not rendezvous",
        }.get(reason, "raised an exception")
        return runfiles.Outcome(
            status="failed",
            reason=reason,
            message=f"rank {rank} (machine {assignment.machine_id}) {what}",
            failing_rank=rank,
            exit_code=1,
            traceback_tail=tail(text),
        )
    except mp.ProcessExitedException as exc:
        rank = assignment.rank_of(exc.error_index)
        how = (
            f"was killed by {exc.signal_name}"
            if exc.signal_name
            else f"exited with code {exc.exit_code}"
        )
        return runfiles.Outcome(
            status="failed",
            reason=FailureReason.RANK_EXITED,
            message=f"rank {rank} (machine {assignment.machine_id}) {how}",
            failing_rank=rank,
            exit_code=exc.exit_code,
        )
    del store
    if runfiles.stopped(config.run_dir):
        return runfiles.Outcome(status="stopped", exit_code=0)
    return runfiles.Outcome(status="succeeded", exit_code=0)


def _said_first(terminate: Callable[[], None], run_dir: Path) -> Callable[[], None]:
    def said_then_sent() -> None:
        runfiles.request_termination(run_dir)
        terminate()

    return said_then_sent


def _the_cause(ranks: Any, first: int, text: str) -> tuple[int, str]:
    """The rank whose failure the part reports: the first to fail, unless it
    only lost a peer and another rank of this machine raised by itself (its
    sockets closed before its process was gone, so it was noticed later)."""
    if classify(text) is not FailureReason.PEER_FAILURE:
        return first, text
    for index, error_file in enumerate(ranks.error_files):
        if index == first or not os.access(error_file, os.R_OK):
            continue
        with open(error_file, "rb") as f:
            other = pickle.load(f)  # written by torch's own wrapper in that rank
        if isinstance(other, str) and classify(other) is not FailureReason.PEER_FAILURE:
            return index, other
    return first, text


def run(run_dir: Path, parent_pid: int | None = None) -> int:
    """Launch the part in ``run_dir`` and record its outcome there; end with
    the parent (the daemon, or the fork server that forked this launcher)."""
    config = runfiles.read_launch(run_dir)
    supervisor = parent_pid or config.parent_pid
    die_with_parent(supervisor, sig=signal.SIGTERM)
    shield.install_for_part(run_dir, supervisor)
    # Started by the daemon, it has the allow-list already; run by hand, not.
    allowed = rank_env.for_ranks(os.environ, config.rank_env)
    os.environ.clear()
    os.environ.update(allowed)
    why_not = hide_files(config.hidden)
    if why_not is not None and os.geteuid() == 0:
        # As root it should have worked; as another user it never does
        # (README: run ranks as a user of their own), and is not news.
        print(f"the node's credential stays readable to the ranks ({why_not})", flush=True)
    outcome = launch(config)
    runfiles.write_outcome(config.run_dir, outcome)
    if outcome.status == "failed":
        print(outcome.message, file=sys.stderr, flush=True)
    return 1 if outcome.status == "failed" else 0


def preload(data_dir: Path, extra_trainers: dict[str, str]) -> list[TrainerOffer]:
    """What the fork server does once for every launch: the imports (torch,
    the ranks, every trainer) and the trainers' ``warm`` (the data they
    read, then shared by every process forked from it). What the trainers
    are, described for the node's registration."""
    import torch.distributed
    import torch.multiprocessing  # noqa: F401

    import worker.rank  # noqa: F401

    with _no_thread_pool():
        return trainers.preload(data_dir, extra_trainers)


def run_attached(run_dir: Path, parent_pid: int) -> int:
    """``run`` in a process forked by the fork server: from here on,
    everything it and its ranks print is the part's."""
    sys.stdout.flush()
    sys.stderr.flush()
    with open(run_dir / runfiles.OUTPUT, "ab") as output:
        os.dup2(output.fileno(), 1)
        os.dup2(output.fileno(), 2)
    return run(run_dir, parent_pid)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m worker.launcher RUN_DIR", file=sys.stderr)
        return 2
    return run(Path(args[0]))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Nothing is left to clean up (the ranks are joined, the outcome is on
    # disk), and tearing down torch's module graph takes about a second.
    os._exit(code)
