"""A torchrun-style DDP script: it reads torchrun's environment, joins the
process group with env://, and trains an MLP to imitate a fixed random
teacher network. The same file runs under `torchrun --nproc_per_node 2
torchrun_mlp.py` and as a ddpo job:

    {"script": {"path": "torchrun_mlp.py", "args": ["--epochs", "3"]},
     "topology": {"num_machines": 2, "num_processes": 1}, "max_restarts": 1}

Four ddpo calls, all harmless elsewhere: ``ddpo.autocast`` runs the forward
pass and loss in the job's ``performance.precision`` (bf16-mixed: bfloat16;
fp32, the default and outside ddpo: unchanged), ``ddpo.report`` sends rank
0's loss and accuracy to the job (under torchrun it prints them),
``ddpo.save_checkpoint`` marks what rank 0 wrote to ``ddpo.checkpoint_dir()``
as the checkpoint a retry resumes from, and ``ddpo.should_stop`` says when
the job is asked to stop (preempted, drained): it then saves at that step
and exits, and its next attempt carries on from the step after it.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import ddpo

FEATURES, CLASSES, SAMPLES = 16, 4, 4096


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument(
        "--step-seconds", type=float, default=0.0, help="pace each step (to follow a run live)"
    )
    return parser.parse_args()


def dataset() -> tuple[torch.Tensor, torch.Tensor]:
    """The same samples in every process: inputs and a teacher's labels."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    teacher = torch.randn(FEATURES, CLASSES, generator=generator)
    return x, (torch.tanh(x) @ teacher).argmax(1)


def main() -> None:
    args = arguments()
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")

    torch.manual_seed(1)  # the same initial weights everywhere
    model = nn.Sequential(
        nn.Linear(FEATURES, args.hidden), nn.ReLU(), nn.Linear(args.hidden, CLASSES)
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    state_file = ddpo.checkpoint_dir() / "state.pt"
    first_epoch, first_step = 1, 1
    if ddpo.resume_epoch() is not None and state_file.exists():
        state = torch.load(state_file, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        # Saved at the end of an epoch, or at a step within it (stopped).
        first_epoch = state["epoch"] + (0 if state.get("step") else 1)
        first_step = state.get("step", 0) + 1
    print(
        f"rank {rank} of {world} (local {local_rank}, machine "
        f"{os.environ.get('GROUP_RANK', 0)}): epochs {first_epoch}..{args.epochs}"
        + (f", from step {first_step}" if first_step > 1 else ""),
        flush=True,
    )
    ddp = DistributedDataParallel(model)
    x, y = dataset()
    for epoch in range(first_epoch, args.epochs + 1):
        # Each rank its own share of this epoch's shuffle, as DistributedSampler does.
        order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(epoch))
        mine = order[rank::world]
        for step in range(first_step if epoch == first_epoch else 1, args.steps_per_epoch + 1):
            start = ((step - 1) * args.batch_size) % (len(mine) - args.batch_size)
            batch = mine[start : start + args.batch_size]
            with ddpo.autocast(device):  # the job's performance.precision
                logits = ddp(x[batch].to(device))
                loss = F.cross_entropy(logits, y[batch].to(device))
            if rank == 0 and epoch == first_epoch and step == first_step:
                print(f"precision {ddpo.precision()}: logits in {logits.dtype}", flush=True)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 10 == 0 or step == args.steps_per_epoch:
                accuracy = (logits.argmax(1) == y[batch].to(device)).float().mean()
                ddpo.report(
                    step=(epoch - 1) * args.steps_per_epoch + step,
                    epoch=epoch,
                    batch=step,
                    batches_per_epoch=args.steps_per_epoch,
                    epochs=args.epochs,
                    loss=loss.item(),
                    accuracy=accuracy.item(),
                )
            time.sleep(args.step_seconds)
            # Every rank asks at the same step; they all get the same answer.
            if step < args.steps_per_epoch and ddpo.should_stop():
                if rank == 0:
                    save(state_file, model, optimizer, epoch, step)
                    ddpo.save_checkpoint(
                        epoch=epoch, step=(epoch - 1) * args.steps_per_epoch + step
                    )
                dist.barrier()
                dist.destroy_process_group()
                return
        if rank == 0:
            save(state_file, model, optimizer, epoch)
            ddpo.save_checkpoint(epoch=epoch)
        dist.barrier()
    dist.destroy_process_group()


def save(
    path: os.PathLike[str],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    epoch: int,
    step: int | None = None,
) -> None:
    """The whole state; ``step``: saved within ``epoch``, after that step."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
    if step is not None:
        state["step"] = step
    torch.save(state, path)


if __name__ == "__main__":
    main()
