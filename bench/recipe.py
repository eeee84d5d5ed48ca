"""The recipe as its users run it: one script, ``mp.spawn``, torchvision's
per-image transforms in a DataLoader, torch's default threads, no
orchestrator. The reference our timings are compared with.

    python -m bench.recipe --data-dir ../shared/data --processes 1 --batch-size 128

Prints the training time, the test accuracy, and a last line of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets, transforms

from cli.cluster import free_port
from worker.mnist import MEAN, STD, Net


def train(local_rank: int, args: argparse.Namespace, port: int) -> None:
    rank = local_rank  # one machine
    world_size = args.processes
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(
        "gloo",
        init_method="env://",
        world_size=world_size,
        rank=rank,
        timeout=timedelta(seconds=300),
    )
    torch.manual_seed(args.seed)
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((MEAN,), (STD,))])
    dataset = datasets.MNIST(args.data_dir, train=True, download=False, transform=transform)
    sampler: DistributedSampler[int] = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, seed=args.seed
    )
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=0)
    model = DistributedDataParallel(Net())
    optimizer = torch.optim.Adadelta(model.parameters(), lr=0.5)
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        model.train()
        for batch_idx, (data, target) in enumerate(loader):
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            if rank == 0 and batch_idx % 10 == 0:
                print(f"Train Epoch: {epoch} [{batch_idx}/{len(loader)}]\tLoss: {loss.item():.6f}")
    train_seconds = time.perf_counter() - start
    if rank == 0:
        test = datasets.MNIST(args.data_dir, train=False, download=False, transform=transform)
        model.module.eval()
        correct = 0
        with torch.no_grad():
            for data, target in DataLoader(test, batch_size=1000):
                correct += int((model.module(data).argmax(1) == target).sum())
        accuracy = correct / len(test)
        print(f"Training complete in {train_seconds:.1f} s; test accuracy {100 * accuracy:.2f}%")
        print(json.dumps({"train_seconds": train_seconds, "test_accuracy": accuracy}))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--data-dir", type=Path, default=Path(os.environ.get("DDPO_DATA_DIR", "./data"))
    )
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    mp.spawn(train, nprocs=args.processes, args=(args, free_port()))


if __name__ == "__main__":
    main()
