"""What a training script imports to talk to ddpo: one call reports
progress and any metrics, one saves a checkpoint a retry resumes from.

    import ddpo

    ddpo.report(step=step, loss=loss.item(), accuracy=acc)
    ...
    torch.save(state, ddpo.checkpoint_dir() / "state.pt")
    ddpo.save_checkpoint(epoch=epoch)
    ...
    start_epoch = (ddpo.resume_epoch() or 0) + 1

A job asked to stop (preempted by a job of a higher priority, its node
drained) stops at a step without losing it, when the script asks every
step, on every rank, and saves where it stopped:

    if ddpo.should_stop():
        torch.save(state, ddpo.checkpoint_dir() / "state.pt")
        ddpo.save_checkpoint(epoch=epoch, step=step)
        sys.exit(0)
    ...
    resumed_at = ddpo.resume_step()  # that step, in the next attempt

A script that never asks is sent SIGTERM once the job's stop grace period
is over (torchrun's convention), then SIGKILL after the worker's grace, and
resumes from its last saved checkpoint.

Under a ddpo worker, rank 0's reports reach the job (GET /jobs/{id},
/jobs/{id}/metrics, the dashboard's chart), batched by the worker as the
built-in trainer's are; other ranks' calls do nothing. Anywhere else (plain
torchrun, a laptop) ``report`` prints one line on rank 0, and the checkpoint
directory is ./checkpoint.

Scripts that drive the server (submit, wait, follow logs, fetch the model)
use ``ddpo.Client`` or ``ddpo.AsyncClient`` (ddpo/client.py) and catch the
typed errors (ddpo/errors.py): ``JobFailed``, ``Invalid``, ``Unauthorized``...

This module imports neither torch nor the server, and the client only when
it is asked for: scripts pay nothing for it.
"""

from __future__ import annotations

import atexit
import math
import os
import tarfile
from numbers import Real
from pathlib import Path
from typing import Any

__all__ = [
    "ApiError",
    "AsyncClient",
    "Client",
    "Conflict",
    "DdpoError",
    "Forbidden",
    "Invalid",
    "JobFailed",
    "NotFound",
    "ServerError",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "WaitTimeout",
    "autocast",
    "checkpoint_dir",
    "is_rank_zero",
    "precision",
    "report",
    "resume_epoch",
    "resume_step",
    "save_checkpoint",
    "should_stop",
]

# Set by the worker for each process it starts (worker/script_launch.py).
RUN_DIR_ENV = "DDPO_RUN_DIR"
CHECKPOINT_DIR_ENV = "DDPO_CHECKPOINT_DIR"
RESUME_EPOCH_ENV = "DDPO_RESUME_EPOCH"
RESUME_STEP_ENV = "DDPO_RESUME_STEP"
PRECISION_ENV = "DDPO_PRECISION"

# The client and its errors, loaded on first use (a training script that
# only reports never imports httpx).
_LAZY = {
    name: "ddpo.client" if name.endswith("Client") else "ddpo.errors"
    for name in __all__
    if name[0].isupper()
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ddpo' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


_writer: Any = None
_steps = 0
_agreement: Any = None


def is_rank_zero() -> bool:
    return os.environ.get("RANK", "0") == "0"


def _number(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if hasattr(value, "item"):  # a one-element tensor or numpy scalar
        value = value.item()
    if not isinstance(value, Real) or isinstance(value, bool):
        raise TypeError(f"report(): {name} must be a number, not {type(value).__name__}")
    number = float(value)
    return number if math.isfinite(number) else None


def report(
    *,
    step: int | None = None,
    loss: Any = None,
    epoch: int | None = None,
    batch: int | None = None,
    batches_per_epoch: int | None = None,
    epochs: int | None = None,
    samples_per_sec: Any = None,
    **metrics: Any,
) -> None:
    """Progress and named metrics from rank 0 (a no-op on other ranks).

    ``step`` counts your steps (the chart's x axis); without one, each call
    is the next step. ``epoch``/``batch``/``batches_per_epoch``/``epochs``
    (when given) drive the job's percent done. Every other keyword is a metric: a number
    (non-finite ones read as null), named with letters, digits, ``_./-``.
    """
    global _writer, _steps
    if not is_rank_zero():
        return
    _steps = step if step is not None else _steps + 1
    values = {name: _number(name, value) for name, value in metrics.items()}
    loss_value = _number("loss", loss)
    speed = _number("samples_per_sec", samples_per_sec)
    run_dir = os.environ.get(RUN_DIR_ENV)
    if run_dir is None:
        shown = {"loss": loss_value, **values} if loss_value is not None else values
        text = " ".join(f"{k}={v:.6g}" if v is not None else f"{k}=nan" for k, v in shown.items())
        print(f"[ddpo] step {_steps}: {text}", flush=True)
        return
    if _writer is None:
        from worker.runfiles import ProgressWriter

        _writer = ProgressWriter(Path(run_dir))
        atexit.register(_writer.close)
    done = batch if batch is not None else _steps
    _writer(
        epoch=epoch or 1,
        batch=done,
        batches_per_epoch=batches_per_epoch or max(done, 1),
        loss=loss_value,
        samples_per_sec=speed,
        step=_steps,
        metrics=values,
        epochs=epochs,
    )


def checkpoint_dir() -> Path:
    """Where rank 0 writes what a retry needs (made if missing). Before a
    retry starts, ddpo puts the last saved checkpoint back here, on every
    machine."""
    path = Path(os.environ.get(CHECKPOINT_DIR_ENV, "checkpoint"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def resume_epoch() -> int | None:
    """The epoch the checkpoint in checkpoint_dir() reached, on a retry;
    None on a first attempt (or outside ddpo). A stop's checkpoint, within
    an epoch, reached the one before it (and :func:`resume_step`)."""
    value = os.environ.get(RESUME_EPOCH_ENV)
    return int(value) if value else None


def resume_step() -> int | None:
    """The step the checkpoint in checkpoint_dir() was saved after, when
    the job stopped there on request (save_checkpoint(step=)); else None."""
    value = os.environ.get(RESUME_STEP_ENV)
    return int(value) if value else None


def precision() -> str:
    """The job's ``performance.precision``: fp32 (the default, and outside
    ddpo), bf16-mixed or fp16-mixed."""
    return os.environ.get(PRECISION_ENV, "fp32")


def autocast(device: Any) -> Any:
    """A context for the forward pass and loss in the job's precision on
    ``device`` (a torch.device or "cpu"/"cuda"): torch.autocast in bfloat16
    or float16, or nothing for fp32. With fp16-mixed, scale the loss with
    ``torch.amp.GradScaler("cuda")`` as torch's AMP recipe does::

        with ddpo.autocast(device):
            loss = F.nll_loss(model(data), target)
        loss.backward()
    """
    import torch

    from ddpo import amp

    return amp.autocast(precision(), torch.device(device).type)


def should_stop() -> bool:
    """Whether the job has been asked to stop (preempted, drained), agreed
    by every rank: call it at the same point of every step on every rank
    (with a process group it is a collective: a one-element all-reduce,
    0.4 ms on gloo over loopback). Once it says so, it says so at every
    call: save a checkpoint with ``save_checkpoint(epoch=, step=)`` and
    exit 0. Always False outside ddpo."""
    global _agreement
    run_dir = os.environ.get(RUN_DIR_ENV)
    if run_dir is None:
        return False
    from worker import runfiles

    folder = Path(run_dir)
    if _agreement is None:
        _agreement = _agreement_for(lambda: runfiles.stop_requested(folder))
    stopping: bool = _agreement()
    if stopping:
        # The part ends "stopped", not "succeeded", once its ranks exit.
        runfiles.write_stopped(folder)
    return stopping


def _agreement_for(wish: Any) -> Any:
    """Every call agrees across the process group when there is one (a
    rank alone just looks)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return wish
    import torch

    from worker.stopping import StopAgreement

    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    return StopAgreement(wish, device, every=1).should_stop


def save_checkpoint(*, epoch: int, step: int | None = None) -> None:
    """Rank 0: what checkpoint_dir() holds now is the job's checkpoint of
    ``epoch`` (or, with ``step``, of that step within ``epoch``: where it
    stopped when asked). The worker uploads it, and a retry resumes from
    it. Call it once the files are written whole; other ranks' calls do
    nothing."""
    if not is_rank_zero() or os.environ.get(RUN_DIR_ENV) is None:
        return
    if epoch < 1:
        raise ValueError("save_checkpoint(): epoch counts from 1")
    if step is not None and step < 0:
        raise ValueError("save_checkpoint(): step counts from 0")
    from worker import runfiles

    run_dir = Path(os.environ[RUN_DIR_ENV])
    if step is None:
        path = runfiles.checkpoint_path(run_dir, epoch)
    else:
        path = runfiles.stop_checkpoint_path(run_dir, epoch, step)
    tmp = path.with_name(f".{path.name}.tmp")
    with tarfile.open(tmp, "w") as archive:
        archive.add(checkpoint_dir(), arcname=".")
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)  # the worker sees it whole or not at all
    if step is None:
        for older, older_epoch in runfiles.checkpoints(run_dir):
            if older_epoch < epoch:
                older.unlink(missing_ok=True)
