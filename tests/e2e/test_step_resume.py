"""The built-in trainer stopped within an epoch, at a step every rank
agrees on, and resumed from that step's checkpoint, ends with the model a
run never stopped ends with, tensor for tensor (issue 28's exactness). Two
real ranks in a gloo process group on loopback, the real MNIST files; the
server and the daemon's part of the stop come in later pieces."""

from __future__ import annotations

import functools
import json
import socket
from datetime import timedelta
from pathlib import Path
from time import perf_counter
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ddpo.schemas import JobSpec
from tests.tensors import assert_same_tensors
from worker import checkpoints, mnist, runfiles
from worker.context import TrainContext
from worker.stopping import StopAgreement

pytestmark = pytest.mark.e2e

SPEC = JobSpec(epochs=2, batch_size=32, max_steps_per_epoch=8, seed=3)
WORLD = 2
EVERY = 3  # the ranks agree every third step


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_main(
    rank: int, port: int, run_dir: str, data_dir: str, resume: str | None, wish_from: int | None
) -> None:
    """One rank: joins the group, trains; rank 1 alone is asked to stop
    from the ``wish_from``-th agreement on (its launcher's word, say)."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=60),
    )
    calls = 0

    def wish() -> bool:
        nonlocal calls
        calls += 1
        return rank == 1 and wish_from is not None and calls >= wish_from

    cpu = torch.device("cpu")
    extra: dict[str, Any] = {}
    if rank == 0:
        extra["checkpoint"] = functools.partial(checkpoints.save, Path(run_dir), spec=SPEC)
    ctx = TrainContext(
        spec=SPEC,
        rank=rank,
        local_rank=rank,
        world_size=WORLD,
        machine_id=rank,
        device=cpu,
        data_dir=Path(data_dir),
        started_at=perf_counter(),
        resume=Path(resume) if resume else None,
        should_stop=StopAgreement(wish, cpu, every=EVERY).should_stop,
        **extra,
    )
    try:
        result = mnist.train(ctx, dropout=True)
        if rank == 0:
            outcome = {"result": result.model_dump() if result else None}
            (Path(run_dir) / "outcome.json").write_text(json.dumps(outcome))
    finally:
        dist.destroy_process_group()


def run(
    run_dir: Path, data_dir: Path, resume: Path | None = None, wish_from: int | None = None
) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    mp.spawn(
        rank_main,
        args=(free_port(), str(run_dir), str(data_dir), str(resume) if resume else None, wish_from),
        nprocs=WORLD,
        join=True,
    )
    outcome: dict[str, Any] = json.loads((run_dir / "outcome.json").read_text())
    return outcome


def final_state(run_dir: Path) -> dict[str, Any]:
    latest = runfiles.latest_checkpoint(run_dir)
    assert latest is not None and latest[1] == SPEC.epochs
    state: dict[str, Any] = torch.load(latest[0], weights_only=True)
    return state


@pytest.mark.parametrize(
    "wish_from,stopped_at",
    # The ranks agree at every third check, one check a step but the last
    # of an epoch (its end saves anyway): 7 checks in epoch 1. Rank 1 asks
    # at the first agreement: all stop after step 3; at the third (check
    # 9): after step 2 of epoch 2. Rank 0 is never asked.
    [(1, (1, 3)), (3, (2, 2))],
)
def test_a_run_stopped_at_a_step_and_resumed_ends_as_one_never_stopped(
    tmp_path: Path, mnist_dir: Path, wish_from: int, stopped_at: tuple[int, int]
) -> None:
    whole = run(tmp_path / "whole", mnist_dir)

    stopped = run(tmp_path / "stopped", mnist_dir, wish_from=wish_from)
    assert stopped["result"] is None  # stopped: no result yet
    epoch, batches = stopped_at
    step = (epoch - 1) * SPEC.max_steps_per_epoch + batches  # type: ignore[operator]
    at_stop = runfiles.stop_checkpoint_path(tmp_path / "stopped", epoch, step)
    assert at_stop.exists(), sorted(p.name for p in (tmp_path / "stopped").iterdir())
    saved = torch.load(at_stop, weights_only=True)
    assert (saved["epoch"], saved["batches_done"], saved["step"]) == (epoch, batches, step)
    # No epoch it did not finish is claimed.
    assert all(e < epoch for _, e in runfiles.checkpoints(tmp_path / "stopped"))

    resumed = run(tmp_path / "resumed", mnist_dir, resume=at_stop)
    compared = assert_same_tensors(
        final_state(tmp_path / "whole")["model"], final_state(tmp_path / "resumed")["model"]
    )
    assert compared == 8  # two convolutions and two linear layers, weights and biases
    assert_same_tensors(
        final_state(tmp_path / "whole")["optimizer"], final_state(tmp_path / "resumed")["optimizer"]
    )
    # The result too: the last epoch's loss is carried across the stop.
    for key in ("train_loss", "test_loss", "test_accuracy"):
        assert resumed["result"][key] == whole["result"][key], key


def test_a_plugin_that_asks_stops_at_its_step_and_resumes_exactly(
    tmp_path: Path, example_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example plugin (examples/charlm) asks ``ctx.should_stop()`` every
    step: stopped after step 4 of epoch 2 and resumed from its checkpoint,
    it ends with the model it ends with unstopped (one rank, gloo)."""
    monkeypatch.syspath_prepend(str(example_site))
    import ddpo_charlm

    spec = JobSpec(trainer="charlm", epochs=2, batch_size=16, max_steps_per_epoch=12, seed=1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:

        def train(folder: Path, stop_at: int | None = None, resume: Path | None = None) -> Any:
            folder.mkdir()
            asked = 0

            def should_stop() -> bool:
                nonlocal asked
                asked += 1
                return stop_at is not None and asked >= stop_at

            return ddpo_charlm.train(
                TrainContext(
                    spec=spec,
                    rank=0,
                    local_rank=0,
                    world_size=1,
                    machine_id=0,
                    device=torch.device("cpu"),
                    data_dir=folder,
                    started_at=perf_counter(),
                    checkpoint=functools.partial(checkpoints.save, folder, spec=spec),
                    resume=resume,
                    should_stop=should_stop,
                    params=ddpo_charlm.TRAINER.params_of(spec),
                )
            )

        train(tmp_path / "whole")
        # Asked at its 15th question: 11 in epoch 1 (none at its last step), 4 in epoch 2.
        assert train(tmp_path / "stopped", stop_at=15) is None
        saved = runfiles.newest_saved(tmp_path / "stopped")
        assert saved is not None and (saved.epoch, saved.step) == (2, 16)
        train(tmp_path / "resumed", resume=saved.path)
    finally:
        dist.destroy_process_group()
    ends = [runfiles.latest_checkpoint(tmp_path / name) for name in ("whole", "resumed")]
    models = [torch.load(end[0], weights_only=True)["model"] for end in ends if end is not None]
    assert len(models) == 2 and assert_same_tensors(*models) >= 4
