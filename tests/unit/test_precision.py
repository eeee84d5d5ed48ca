"""performance.precision (ddpo/amp.py): the name a job gives turns into
torch's autocast and loss scaler the same way for the built-in trainer,
plugins (ctx.autocast) and scripts (ddpo.autocast); fp32 leaves the
recipe's maths alone; a precision the backend cannot run is refused at
submit, naming the field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch import nn, optim

import ddpo
from ddpo import amp
from ddpo.schemas import JobSpec
from worker import mnist
from worker.context import TrainContext


def context(precision: str, backend: str = "gloo") -> TrainContext:
    spec = JobSpec(backend=backend, performance={"precision": precision})
    return TrainContext(
        spec=spec,
        rank=0,
        local_rank=0,
        world_size=1,
        machine_id=0,
        device=torch.device("cpu"),
        data_dir=Path("."),
        started_at=0.0,
    )


def test_bf16_mixed_runs_the_forward_pass_in_bfloat16_and_keeps_fp32_weights() -> None:
    model = nn.Linear(8, 4)
    ctx = context("bf16-mixed")
    with ctx.autocast():
        out = model(torch.randn(2, 8))
    assert out.dtype == torch.bfloat16
    assert model.weight.dtype == torch.float32
    assert not ctx.grad_scaler().is_enabled()  # bfloat16 needs no loss scaling


def test_fp32_is_the_recipes_maths_bit_for_bit() -> None:
    """A step through train_step with fp32's (empty) autocast gives the
    very weights the plain step gives."""
    torch.manual_seed(0)
    model = mnist.Net()
    twin = copy.deepcopy(model)
    data, target = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    ctx = context("fp32")
    torch.manual_seed(1)  # the same dropout masks in both steps
    mnist.train_step(model, optim.Adadelta(model.parameters(), lr=0.5), data, target, ctx.autocast)
    torch.manual_seed(1)
    plain = optim.Adadelta(twin.parameters(), lr=0.5)
    plain.zero_grad()
    F.nll_loss(twin(data), target).backward()
    plain.step()
    for ours, theirs in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(ours, theirs)


def test_a_bf16_step_of_the_recipes_model_learns_in_bfloat16() -> None:
    torch.manual_seed(0)
    model = mnist.Net().eval()  # no dropout: the loss falls on one batch
    optimizer = optim.Adadelta(model.parameters(), lr=0.5)
    data, target = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))
    ctx = context("bf16-mixed")
    seen: list[torch.dtype] = []
    model.conv2.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    losses = [
        float(mnist.train_step(model, optimizer, data, target, ctx.autocast)) for _ in range(5)
    ]
    assert seen == [torch.bfloat16] * 5  # train_step ran the convolutions in bfloat16
    assert losses[-1] < losses[0]
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_fp16_mixed_scales_the_loss() -> None:
    scaler = amp.grad_scaler("fp16-mixed", "cpu")
    assert scaler.is_enabled()
    assert not amp.grad_scaler("fp32", "cpu").is_enabled()


def test_a_scripts_autocast_follows_the_jobs_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = nn.Linear(8, 4)
    monkeypatch.delenv(ddpo.PRECISION_ENV, raising=False)
    assert ddpo.precision() == "fp32"  # outside ddpo
    with ddpo.autocast("cpu"):
        assert layer(torch.randn(2, 8)).dtype == torch.float32
    monkeypatch.setenv(ddpo.PRECISION_ENV, "bf16-mixed")
    with ddpo.autocast(torch.device("cpu")):
        assert layer(torch.randn(2, 8)).dtype == torch.bfloat16
    monkeypatch.setenv(ddpo.PRECISION_ENV, "fp8")
    with pytest.raises(ValueError, match="precision 'fp8'"):
        ddpo.autocast("cpu")


def test_fp16_on_cpus_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="precision: fp16-mixed runs on GPUs"):
        JobSpec(backend="gloo", performance={"precision": "fp16-mixed"})
    assert JobSpec(backend="nccl", performance={"precision": "fp16-mixed"})
    assert JobSpec(performance={"precision": "bf16-mixed"}).performance.precision == "bf16-mixed"
    with pytest.raises(ValidationError, match="precision"):
        JobSpec(performance={"precision": "fp8"})
