"""performance.flat_optimizer (worker/adadelta.py): Adadelta's step over flat
buffers gives the very weights and state torch's Adadelta gives, step after
step, through a checkpoint in either direction and when a gradient is not its
own; performance.inplace_relu changes no value either."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn, optim
from torch.nn.parallel import DistributedDataParallel

from ddpo.schemas import JobSpec
from worker import mnist
from worker.adadelta import FlatAdadelta

CPU = torch.device("cpu")


def model_pair() -> tuple[nn.Module, nn.Module]:
    """The built-in trainer's model as the default job builds it (channels
    last, dropout on), twice with the same weights."""
    torch.manual_seed(0)
    model = mnist.build_model(JobSpec(), CPU)
    return model, copy.deepcopy(model)


def batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    return [
        (
            torch.randn(32, 1, 28, 28, generator=generator).contiguous(
                memory_format=torch.channels_last
            ),
            torch.randint(0, 10, (32,), generator=generator),
        )
        for _ in range(count)
    ]


def train(
    model: nn.Module,
    optimizer: optim.Optimizer,
    data: list[tuple[torch.Tensor, torch.Tensor]],
    seed: int,
) -> None:
    for index, (images, target) in enumerate(data):
        torch.manual_seed(seed + index)  # the same dropout masks for both models
        mnist.train_step(model, optimizer, images, target)


def assert_same(a: nn.Module, b: nn.Module, oa: optim.Optimizer, ob: optim.Optimizer) -> None:
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
        assert pa.stride() == pb.stride()  # the layout the model was built in
    sa, sb = oa.state_dict(), ob.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys()
    for index, state in sa["state"].items():
        assert state.keys() == sb["state"][index].keys()
        for name, value in state.items():
            assert torch.equal(value, sb["state"][index][name]), (index, name)


def test_flat_steps_give_torchs_weights_and_state_bit_for_bit() -> None:
    flat_model, torch_model = model_pair()
    flat = FlatAdadelta(flat_model.parameters(), lr=0.5)
    plain = optim.Adadelta(torch_model.parameters(), lr=0.5)
    data = batches(6)
    train(flat_model, flat, data[:3], seed=10)
    train(torch_model, plain, data[:3], seed=10)
    assert_same(flat_model, torch_model, flat, plain)
    # A learning rate changed between steps (a scheduler) is the one used.
    for optimizer in (flat, plain):
        optimizer.param_groups[0]["lr"] = 0.1
    train(flat_model, flat, data[3:], seed=20)
    train(torch_model, plain, data[3:], seed=20)
    assert_same(flat_model, torch_model, flat, plain)
    assert any(
        not torch.equal(p, q)
        for p, q in zip(flat_model.parameters(), model_pair()[0].parameters(), strict=True)
    )


@pytest.mark.parametrize("saved_by", ["flat", "torch"])
def test_a_checkpoint_moves_between_flat_and_torchs_adadelta(saved_by: str) -> None:
    first, second = model_pair()
    data = batches(4)
    saver = (
        FlatAdadelta(first.parameters(), lr=0.5)
        if saved_by == "flat"
        else optim.Adadelta(first.parameters(), lr=0.5)
    )
    train(first, saver, data[:2], seed=0)
    checkpoint = {
        "model": copy.deepcopy(first.state_dict()),
        "optimizer": copy.deepcopy(saver.state_dict()),
    }
    # Resumed by the other kind, and the saver goes on: the same weights.
    second.load_state_dict(checkpoint["model"])
    loader = (
        optim.Adadelta(second.parameters(), lr=0.5)
        if saved_by == "flat"
        else FlatAdadelta(second.parameters(), lr=0.5)
    )
    loader.load_state_dict(checkpoint["optimizer"])
    train(first, saver, data[2:], seed=5)
    train(second, loader, data[2:], seed=5)
    assert_same(first, second, saver, loader)


def test_a_flat_optimizer_resumed_keeps_its_flat_step() -> None:
    model, twin = model_pair()
    optimizer = FlatAdadelta(model.parameters(), lr=0.5)
    train(model, optimizer, batches(1), seed=0)
    resumed = FlatAdadelta(twin.parameters(), lr=0.5)
    resumed.load_state_dict(optimizer.state_dict())
    resumed.zero_grad()
    # Every gradient is a view of one buffer again, laid out as its parameter.
    grads = [p.grad for p in twin.parameters()]
    assert all(
        g is not None and g.stride() == p.stride()
        for g, p in zip(grads, twin.parameters(), strict=True)
    )
    storages = {g.untyped_storage().data_ptr() for g in grads if g is not None}
    assert len(storages) == 1


def test_gradients_that_are_not_its_views_take_torchs_step() -> None:
    """Someone else's gradients (DDP's bucket views, a module's zero_grad
    setting them to None): still Adadelta's numbers."""
    flat_model, torch_model = model_pair()
    flat = FlatAdadelta(flat_model.parameters(), lr=0.5)
    plain = optim.Adadelta(torch_model.parameters(), lr=0.5)
    data = batches(4)
    for index, (images, target) in enumerate(data):
        for model, optimizer in ((flat_model, flat), (torch_model, plain)):
            model.zero_grad(set_to_none=True)  # new gradient tensors from autograd
            torch.manual_seed(index)
            F.nll_loss(model(images), target).backward()
            optimizer.step()
    assert_same(flat_model, torch_model, flat, plain)


def test_inplace_relu_gives_the_same_values_and_gradients() -> None:
    torch.manual_seed(1)
    recipe = mnist.Net(dropout=False)
    fast = mnist.Net(dropout=False, inplace_relu=True)
    fast.load_state_dict(recipe.state_dict())
    images, target = batches(1)[0]
    for model in (recipe, fast):
        F.nll_loss(model(images), target).backward()
    for p, q in zip(recipe.parameters(), fast.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        assert torch.equal(p.grad, q.grad)


@pytest.mark.parametrize("bucket_views", [False, True])
def test_under_ddp_the_flat_step_gives_torchs_weights(tmp_path: Path, bucket_views: bool) -> None:
    """DDP copies its averaged gradients into the flat views, or (with
    gradient_as_bucket_view) puts its own buckets there: either way the
    weights are Adadelta's."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        flat_model, torch_model = model_pair()
        flat = FlatAdadelta(flat_model.parameters(), lr=0.5)  # before DDP, as train() does
        plain = optim.Adadelta(torch_model.parameters(), lr=0.5)
        wrapped = [
            DistributedDataParallel(model, gradient_as_bucket_view=bucket_views)
            for model in (flat_model, torch_model)
        ]
        data = batches(3)
        train(wrapped[0], flat, data, seed=0)
        train(wrapped[1], plain, data, seed=0)
        assert_same(flat_model, torch_model, flat, plain)
    finally:
        dist.destroy_process_group()
