"""Trainers the end-to-end tests install on their workers (the way an
operator would: ``--trainer name=module:attribute``)."""

from __future__ import annotations

import functools
import os
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ddpo.schemas import TrainResult
from worker import mnist
from worker.context import TrainContext
from worker.trainers import Trainer


def _last_rank_raises(ctx: TrainContext) -> TrainResult | None:
    dist.all_reduce(torch.ones(1))  # every rank has joined
    if ctx.rank == ctx.world_size - 1:
        raise ValueError(f"injected failure on rank {ctx.rank}")
    # The others are inside a collective when it dies, as in real training.
    dist.all_reduce(torch.ones(1))
    return None


CRASH = Trainer(train=_last_rank_raises)


def _last_rank_raises_then_lingers(ctx: TrainContext) -> TrainResult | None:
    """As CRASH, but the rank that raised takes its time to exit (a thread
    of its own keeps the process, as a library's teardown may on a busy
    host): its peer's symptom reaches the server, which stops this part,
    long before this rank's launcher could record the cause."""
    if ctx.rank == ctx.world_size - 1:
        threading.Thread(target=time.sleep, args=(60,), name="lingers").start()
    return _last_rank_raises(ctx)


CRASH_THEN_LINGER = Trainer(train=_last_rank_raises_then_lingers)


def _last_rank_dies_between_steps(ctx: TrainContext) -> TrainResult | None:
    ddp = DistributedDataParallel(torch.nn.Linear(4, 1))
    ctx.attach_comm_hook(ddp)  # shared-memory averaging when the job has one machine
    for step in range(1_000_000):
        if step == 3 and ctx.rank == ctx.world_size - 1:
            os._exit(3)  # no traceback, no goodbye: as if killed
        ddp(torch.ones(2, 4)).sum().backward()
    return None


# The others are left waiting for the dead rank's gradients.
DIES = Trainer(train=_last_rank_dies_between_steps)


# The built-in MNIST training with dropout off, so that runs over different
# topologies must agree to float tolerance.
NO_DROPOUT = Trainer(train=functools.partial(mnist.train, dropout=False), prepare=mnist.prepare)


def _nothing(ctx: TrainContext) -> TrainResult | None:
    return None


# Costs next to nothing beyond the launch itself: for tests of the
# orchestration under load.
NOOP = Trainer(train=_nothing)


def _first_attempt_killed(ctx: TrainContext) -> TrainResult | None:
    """Rank 0 is killed by SIGKILL (a retryable failure) the first time a job
    of this name runs; the next attempt succeeds."""
    import signal
    import tempfile
    from pathlib import Path

    marker = Path(tempfile.gettempdir()) / f"ddpo-killed-once-{ctx.spec.name}"
    dist.all_reduce(torch.ones(1))
    if ctx.rank == 0 and not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    if ctx.rank == 0:
        marker.unlink()  # the retry: leave nothing behind in the temporary folder
    dist.all_reduce(torch.ones(1))
    return None


KILLED_ONCE = Trainer(train=_first_attempt_killed)


def hold_marker(name: str) -> str:
    """The file whose appearance lets a ``hold`` job of this name finish."""
    import tempfile
    from pathlib import Path

    return str(Path(tempfile.gettempdir()) / f"ddpo-release-{name}")


def _held_until_released(ctx: TrainContext) -> TrainResult | None:
    """Every rank waits, idle, until the test touches the job's marker (at
    most 5 minutes): a job that holds its slots for exactly as long as a
    test needs, without training's CPU."""
    import time
    from pathlib import Path

    marker = Path(hold_marker(ctx.spec.name or ""))
    deadline = time.monotonic() + 300
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    dist.all_reduce(torch.ones(1))
    return None


HOLD = Trainer(train=_held_until_released)


def _one_big_checkpoint(ctx: TrainContext) -> TrainResult | None:
    """One step of a model whose checkpoint is DDPO_TEST_CHECKPOINT_MB
    megabytes (float32 weights), saved as the end of epoch 1: what a large
    model's checkpoint costs the worker and the server to pass on."""
    megabytes = int(os.environ.get("DDPO_TEST_CHECKPOINT_MB", "1024"))
    model = torch.nn.Module()
    # Random, not zeros: no layer on the way can shrink it.
    model.weight = torch.nn.Parameter(torch.rand(megabytes * 2**18))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ctx.report(epoch=1, batch=1, batches_per_epoch=1, loss=0.0, samples_per_sec=None)
    ctx.checkpoint(model=model, optimizer=optimizer, epoch=1, step=1)
    return TrainResult(train_loss=0.0)


BIG_CHECKPOINT = Trainer(train=_one_big_checkpoint)
