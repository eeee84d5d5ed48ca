"""One rank: its threads, its place in the process group, the trainer, and
always leaving the group."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import traceback
from datetime import timedelta
from time import perf_counter

import torch
import torch.distributed as dist

from worker import (
    checkpoints,
    fused_pool,
    local_allreduce,
    network,
    rank_env,
    runfiles,
    shield,
    trainers,
)
from worker._process import die_with_parent
from worker.context import TrainContext
from worker.stopping import StopAgreement


def threads_for(config: runfiles.LaunchConfig) -> int:
    """The spec's choice, else this node's share: the cores its worker may
    use (affinity, cgroup quota, --cpus) over the local ranks."""
    chosen = config.assignment.spec.performance.threads_per_process
    if chosen is not None:
        return chosen
    return max(1, config.cpus // config.local_processes)


def run_rank(
    local_rank: int,
    config: runfiles.LaunchConfig,
    launcher_pid: int,
    local_group: local_allreduce.LocalGroup | None = None,
) -> None:
    """The function the launcher starts in each process of this machine."""
    started_at = perf_counter()
    die_with_parent(launcher_pid)
    shield.install_for_part(config.run_dir, launcher_pid)
    # Before any tensor work: the pool is sized once.
    torch.set_num_threads(threads_for(config))
    if config.assignment.spec.performance.fused_pool:
        fused_pool.load(config.extensions_dir)
    else:
        fused_pool.disable("performance.fused_pool is off")
    assignment = config.assignment
    os.environ.update(rank_env.tracking(assignment))  # a plugin's own MLflow calls
    spec = assignment.spec
    rank = assignment.rank_of(local_rank)
    runfiles.capture_output(config.run_dir, rank)
    device = join_group(config, local_rank)
    report = runfiles.ProgressWriter(config.run_dir) if rank == 0 else None
    agreement = StopAgreement(lambda: runfiles.stop_requested(config.run_dir), device)
    try:
        trainer = trainers.resolve(spec.trainer, config.trainers)
        context = train_context(config, local_rank, device, started_at, report, local_group)
        context = dataclasses.replace(
            context, params=trainer.params_of(spec), should_stop=agreement.should_stop
        )
        result = trainer.train(context)
        if agreement.agreed and local_rank == 0:
            # Every rank stopped at the agreed step: the part stopped as asked.
            runfiles.write_stopped(config.run_dir)
        elif rank == 0 and result is not None:
            if result.precision is None:  # the trainer did not say: the spec's
                result = result.model_copy(update={"precision": spec.performance.precision})
            runfiles.write_result(config.run_dir, result)
    except BaseException as exc:
        text = traceback.format_exc()
        if isinstance(exc, Exception):
            # On disk before this rank leaves the group (below), which is
            # when its peers notice: if their symptom reaches the server
            # first and this node is told to stop the part, the signal may
            # land before the launcher records this cause; the daemon then
            # reads it here.
            with contextlib.suppress(OSError):
                runfiles.write_rank_failure(config.run_dir, rank, text)
        # The launcher relays this too; printing it here puts it in the
        # part's log with the rank that raised it.
        print(f"rank {rank} failed:\n{text}", flush=True)
        raise
    finally:
        if report is not None:
            report.close()
        dist.destroy_process_group()


def join_group(config: runfiles.LaunchConfig, local_rank: int) -> torch.device:
    """Wait for the rendezvous port, then join the job's process group as
    torchrun's ranks do (its variables set); the device this rank trains on."""
    assignment = config.assignment
    spec = assignment.spec
    rank = assignment.rank_of(local_rank)
    master_port = runfiles.await_rendezvous(config.run_dir, config.process_group_timeout_s)
    os.environ.update(
        MASTER_ADDR=assignment.master_addr,
        MASTER_PORT=str(master_port),
        WORLD_SIZE=str(assignment.world_size),
        RANK=str(rank),
        LOCAL_RANK=str(local_rank),
        LOCAL_WORLD_SIZE=str(spec.topology.num_processes),
        # Machine 0's launcher hosts the store; every rank is its client.
        TORCHELASTIC_USE_AGENT_STORE="True",
        # Collectives bind and advertise the interface of the node's address,
        # not whatever the host name resolves to (often loopback).
        **network.collective_env(config.interface, os.environ),
    )
    if spec.backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        spec.backend,
        init_method="env://",
        world_size=assignment.world_size,
        rank=rank,
        timeout=timedelta(seconds=config.process_group_timeout_s),
    )
    return device


def train_context(
    config: runfiles.LaunchConfig,
    local_rank: int,
    device: torch.device,
    started_at: float,
    report: runfiles.ProgressWriter | None,
    local_group: local_allreduce.LocalGroup | None,
) -> TrainContext:
    """What the trainer gets: its place, its device, and (rank 0) where it
    reports progress and writes checkpoints."""
    assignment = config.assignment
    spec = assignment.spec
    rank = assignment.rank_of(local_rank)
    extra: dict[str, object] = {}
    if report is not None:
        extra = {
            "report": report,
            "checkpoint": functools.partial(checkpoints.save, config.run_dir, spec=spec),
        }
    if local_group is not None:
        extra["attach_comm_hook"] = functools.partial(
            local_allreduce.attach, group=local_group, rank=rank, world_size=assignment.world_size
        )
    return TrainContext(
        spec=spec,
        rank=rank,
        local_rank=local_rank,
        world_size=assignment.world_size,
        machine_id=assignment.machine_id,
        device=device,
        data_dir=config.data_dir,
        started_at=started_at,
        resume=config.resume_from,
        **extra,  # type: ignore[arg-type]
    )
