"""The built-in trainer: the classic DDP-on-MNIST recipe, faithfully.

A small ConvNet, Adadelta, NLL loss, MNIST normalised with mean 0.1302 and
std 0.3069, a DistributedSampler over all ranks, a per-process batch size.
Rank 0 logs every 10 batches and measures test accuracy at the end.
"""

from __future__ import annotations

from pathlib import Path
from time import perf_counter

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets, transforms

from api.schemas import TrainResult
from worker.context import TrainContext
from worker.trainers import Trainer

MEAN, STD = 0.1302, 0.3069
LOG_EVERY = 10
TEST_BATCH_SIZE = 1000
FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1)
        self.dropout1 = nn.Dropout(0.10)
        self.dropout2 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(4608, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


class DataUnavailable(RuntimeError):
    pass


def _transform() -> transforms.Compose:
    return transforms.Compose([transforms.ToTensor(), transforms.Normalize((MEAN,), (STD,))])


def prepare(data_dir: Path) -> None:
    """Make sure the MNIST files are there, downloading them only if they
    are absent (torchvision skips the download when the files exist)."""
    try:
        datasets.MNIST(data_dir, train=True, download=True)
        datasets.MNIST(data_dir, train=False, download=True)
    except Exception as exc:
        raw = Path(data_dir).resolve() / "MNIST" / "raw"
        raise DataUnavailable(
            f"MNIST is not in {raw} and could not be downloaded ({exc}). "
            f"Put {', '.join(FILES)} there, or point DDPO_DATA_DIR (--data-dir) "
            f"at a directory whose MNIST/raw holds them."
        ) from exc


def train(ctx: TrainContext) -> TrainResult | None:
    spec = ctx.spec
    torch.manual_seed(spec.seed)
    on_gpu = ctx.device.type == "cuda"

    dataset = datasets.MNIST(ctx.data_dir, train=True, download=False, transform=_transform())
    # Every rank sees a disjoint 1/world_size of the data each epoch.
    sampler: DistributedSampler[tuple[torch.Tensor, int]] = DistributedSampler(
        dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=spec.seed
    )
    loader = DataLoader(
        dataset, batch_size=spec.batch_size, sampler=sampler, num_workers=0, pin_memory=on_gpu
    )
    model = Net().to(ctx.device)
    ddp = DistributedDataParallel(model, device_ids=[ctx.local_rank] if on_gpu else None)
    optimizer = optim.Adadelta(ddp.parameters(), lr=spec.lr)

    batches_per_epoch = len(loader)
    if spec.max_steps_per_epoch is not None:
        batches_per_epoch = min(batches_per_epoch, spec.max_steps_per_epoch)
    samples_per_batch = spec.batch_size * ctx.world_size

    train_started = perf_counter()
    epoch_seconds: list[float] = []
    last_epoch_loss = torch.zeros((), device=ctx.device)
    for epoch in range(1, spec.epochs + 1):
        # Reshuffle differently each epoch, identically on every rank.
        sampler.set_epoch(epoch)
        ddp.train()
        epoch_started = window_started = perf_counter()
        window_done = 0
        epoch_loss = torch.zeros((), device=ctx.device)
        for batch_idx, (data, target) in enumerate(loader):
            if batch_idx >= batches_per_epoch:
                break
            data = data.to(ctx.device, non_blocking=True)
            target = target.to(ctx.device, non_blocking=True)
            optimizer.zero_grad()
            loss = F.nll_loss(ddp(data), target)
            loss.backward()
            optimizer.step()
            # Accumulate on the device: no host sync on batches we don't log.
            epoch_loss += loss.detach()
            done = batch_idx + 1
            if ctx.is_master and (batch_idx % LOG_EVERY == 0 or done == batches_per_epoch):
                now = perf_counter()
                value = loss.item()
                rate = (done - window_done) * samples_per_batch / max(now - window_started, 1e-9)
                window_started, window_done = now, done
                print(
                    f"Train Epoch: {epoch} [{done * samples_per_batch}/{len(dataset)} "
                    f"({100.0 * done / batches_per_epoch:.0f}%)]\tLoss: {value:.6f}",
                    flush=True,
                )
                ctx.report(
                    epoch=epoch,
                    batch=done,
                    batches_per_epoch=batches_per_epoch,
                    loss=value,
                    samples_per_sec=rate,
                )
        epoch_seconds.append(perf_counter() - epoch_started)
        last_epoch_loss = epoch_loss / batches_per_epoch
    train_seconds = perf_counter() - train_started

    if not ctx.is_master:
        return None
    eval_started = perf_counter()
    test_loss, accuracy = evaluate(model, ctx.data_dir, ctx.device)
    eval_seconds = perf_counter() - eval_started
    print(f"Test set: average loss {test_loss:.4f}, accuracy {100 * accuracy:.2f}%", flush=True)
    return TrainResult(
        train_loss=float(last_epoch_loss.item()),
        test_loss=test_loss,
        test_accuracy=accuracy,
        setup_seconds=round(train_started - ctx.started_at, 3),
        train_seconds=round(train_seconds, 3),
        eval_seconds=round(eval_seconds, 3),
        epoch_seconds=[round(s, 3) for s in epoch_seconds],
        samples_per_sec=round(
            spec.epochs * batches_per_epoch * samples_per_batch / train_seconds, 1
        ),
    )


def evaluate(model: nn.Module, data_dir: Path, device: torch.device) -> tuple[float, float]:
    """Average loss and accuracy on the 10,000-image test set (the plain
    module, not the DDP wrapper: only rank 0 runs this)."""
    test_set = datasets.MNIST(data_dir, train=False, download=False, transform=_transform())
    loader = DataLoader(test_set, batch_size=TEST_BATCH_SIZE)
    model.eval()
    total_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            total_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += int((output.argmax(dim=1) == target).sum().item())
    return total_loss / len(test_set), correct / len(test_set)


TRAINER = Trainer(train=train, prepare=prepare)
