"""charlm: a character-level language model, as a ddpo trainer plugin.

An MLP over the last ``context`` characters predicts the next one (Bengio et
al.'s neural language model, at the scale of characters), trained with Adam
on the text shipped in this package, with DDP over every rank. Each rank
draws its own random windows (seeded by job, epoch and rank); rank 0 reports
loss, perplexity and character accuracy, checkpoints every epoch, and scores
the held-out tail of the text at the end.

ddpo finds it through the entry point in pyproject.toml; its parameters are
the pydantic model below, whose JSON schema the workers report, so a job with
a bad parameter is refused when it is submitted.
"""

from __future__ import annotations

import math
from importlib.resources import files
from time import perf_counter

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddpo.schemas import TrainResult
from worker import checkpoints
from worker.context import TrainContext
from worker.trainers import Trainer

__version__ = "0.2.0"

REPORT_EVERY = 10
# The last tenth of the text is held out for the final score.
HELD_OUT = 0.1


class CharLMParams(BaseModel):
    """What a charlm job may set in ``params`` (the spec's batch_size, epochs,
    seed and max_steps_per_epoch apply as for any trainer)."""

    model_config = ConfigDict(extra="forbid")

    context: int = Field(8, ge=1, le=64, description="Characters the model sees")
    embed_dim: int = Field(24, ge=1, le=512, description="Size of a character's embedding")
    hidden: int = Field(128, ge=1, le=4096, description="Units of the hidden layer")
    learning_rate: float = Field(0.01, gt=0, le=1, description="Adam's step size")
    steps_per_epoch: int = Field(60, ge=1, le=100_000)


class CharMLP(nn.Module):
    def __init__(self, vocab: int, params: CharLMParams) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, params.embed_dim)
        self.hidden = nn.Linear(params.context * params.embed_dim, params.hidden)
        self.out = nn.Linear(params.hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.hidden(self.embed(x).flatten(1)))
        return self.out(h)


def corpus() -> str:
    return files(__package__).joinpath("corpus.txt").read_text(encoding="utf-8")


def windows(
    ids: torch.Tensor, context: int, batch: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` random (context characters, next character) pairs."""
    starts = torch.randint(0, len(ids) - context, (batch,), generator=generator)
    x = torch.stack([ids[s : s + context] for s in starts.tolist()])
    return x, ids[starts + context]


def train(ctx: TrainContext) -> TrainResult | None:
    params: CharLMParams = ctx.params
    spec = ctx.spec
    text = corpus()
    vocab = sorted(set(text))
    ids = torch.tensor([vocab.index(c) for c in text])
    split = int(len(ids) * (1 - HELD_OUT))
    train_ids, test_ids = ids[:split], ids[split:]

    torch.manual_seed(spec.seed)  # the same initial weights on every rank
    model = CharMLP(len(vocab), params).to(ctx.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=params.learning_rate)
    # Where it starts: a retry after an epoch's checkpoint, or the step a
    # stop's checkpoint was taken at (asked to stop: preempted, drained).
    start = checkpoints.ResumePoint(1, 0, 0.0)
    if ctx.resume is not None:
        start = checkpoints.resume(ctx.resume, model, optimizer)
    ddp = DistributedDataParallel(model)
    steps = min(params.steps_per_epoch, spec.max_steps_per_epoch or params.steps_per_epoch)
    setup_seconds = perf_counter() - ctx.started_at
    train_started = perf_counter()
    last_loss = float("nan")
    for epoch in range(start.epoch, spec.epochs + 1):
        generator = torch.Generator().manual_seed(spec.seed * 1_000_003 + epoch * 1009 + ctx.rank)
        first = start.batches_done if epoch == start.epoch else 0
        for _ in range(first):  # the batches trained before the stop, drawn again
            windows(train_ids, params.context, spec.batch_size, generator)
        epoch_started = perf_counter()
        for step in range(first + 1, steps + 1):
            x, y = windows(train_ids, params.context, spec.batch_size, generator)
            logits = ddp(x.to(ctx.device))
            loss = F.cross_entropy(logits, y.to(ctx.device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % REPORT_EVERY == 0 or step == steps:
                last_loss = loss.item()
                accuracy = (logits.argmax(1) == y.to(ctx.device)).float().mean().item()
                seen = step * spec.batch_size * ctx.world_size
                ctx.report(
                    epoch=epoch,
                    batch=step,
                    batches_per_epoch=steps,
                    loss=last_loss,
                    samples_per_sec=seen / (perf_counter() - epoch_started),
                    metrics={
                        "perplexity": math.exp(min(last_loss, 50.0)),
                        "char_accuracy": accuracy,
                    },
                )
            # Every rank asks at every step; all get the same answer.
            if step < steps and ctx.should_stop():
                ctx.checkpoint(
                    model=model,
                    optimizer=optimizer,
                    epoch=epoch,
                    step=(epoch - 1) * steps + step,
                    batches_done=step,
                )
                return None
        ctx.checkpoint(model=model, optimizer=optimizer, epoch=epoch, step=epoch * steps)
    train_seconds = perf_counter() - train_started

    test_loss, test_accuracy = score(model, test_ids, params.context, ctx.device)
    return TrainResult(
        train_loss=last_loss if math.isfinite(last_loss) else None,
        test_loss=test_loss,
        test_accuracy=test_accuracy,
        setup_seconds=setup_seconds,
        train_seconds=train_seconds,
    )


@torch.no_grad()
def score(
    model: nn.Module, ids: torch.Tensor, context: int, device: torch.device
) -> tuple[float, float]:
    model.eval()
    x = ids.unfold(0, context, 1)[:-1]
    y = ids[context:]
    logits = model(x.to(device))
    loss = F.cross_entropy(logits, y.to(device)).item()
    accuracy = (logits.argmax(1) == y.to(device)).float().mean().item()
    return loss, accuracy


TRAINER = Trainer(train=train, params=CharLMParams, version=__version__)
