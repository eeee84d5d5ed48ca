"""The fast paths compute what the recipe computes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from ddpo.schemas import JobSpec, Performance
from worker import mnist
from worker.mnist import Net, build_model, train_data

CPU = torch.device("cpu")


def spec(pipeline: str, batch_size: int = 128, seed: int = 0) -> JobSpec:
    return JobSpec(
        batch_size=batch_size, seed=seed, performance=Performance(data_pipeline=pipeline)
    )


@pytest.mark.parametrize(
    "rank,world_size,batch_size,epoch,batches",
    [(0, 1, 128, 1, None), (1, 2, 64, 3, 60), (3, 8, 16, 2, 60)],
)
def test_tensor_batches_are_the_torchvision_batches_bit_for_bit(
    mnist_dir: Path, rank: int, world_size: int, batch_size: int, epoch: int, batches: int | None
) -> None:
    fast = train_data(spec("tensor", batch_size), mnist_dir, rank, world_size, CPU)
    recipe = train_data(spec("torchvision", batch_size), mnist_dir, rank, world_size, CPU)
    assert fast.batches_per_epoch == recipe.batches_per_epoch
    compared = 0
    for (images, labels), (ref_images, ref_labels) in zip(
        fast.epoch(epoch, CPU), recipe.epoch(epoch, CPU), strict=True
    ):
        assert torch.equal(images, ref_images)
        assert torch.equal(labels, ref_labels)
        compared += 1
        if batches is not None and compared == batches:
            break
    assert compared == (batches or recipe.batches_per_epoch)


def test_epochs_are_shuffled_differently(mnist_dir: Path) -> None:
    data = train_data(spec("tensor"), mnist_dir, 0, 1, CPU)
    first = next(data.epoch(1, CPU))[1]
    second = next(data.epoch(2, CPU))[1]
    assert not torch.equal(first, second)


def gradients(model: torch.nn.Module, images: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    model.zero_grad()
    output = model(images)
    F.nll_loss(output, target).backward()
    grads = [p.grad.flatten() for p in model.parameters() if p.grad is not None]
    return torch.cat([output.flatten(), *grads])


@pytest.fixture
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(64, 1, 28, 28, generator=generator), torch.randint(
        0, 10, (64,), generator=generator
    )


def test_pooling_before_relu_gives_the_same_values_and_gradients(
    batch: tuple[torch.Tensor, torch.Tensor],
) -> None:
    torch.manual_seed(1)
    recipe = Net(dropout=False)
    fast = Net(dropout=False, pool_before_relu=True)
    fast.load_state_dict(recipe.state_dict())
    assert torch.equal(gradients(recipe, *batch), gradients(fast, *batch))


def test_channels_last_gives_the_same_values_and_gradients(
    batch: tuple[torch.Tensor, torch.Tensor],
) -> None:
    torch.manual_seed(1)
    recipe = Net(dropout=False)
    fast = build_model(JobSpec(), CPU, dropout=False)
    fast.load_state_dict(recipe.state_dict())
    images, target = batch
    torch.testing.assert_close(
        gradients(recipe, images, target),
        gradients(fast, images.contiguous(memory_format=torch.channels_last), target),
        rtol=1e-5,
        atol=1e-6,
    )


@pytest.mark.parametrize("masks", ["pcg64", "uniform", "bernoulli"])
def test_dropout_masks_keep_one_minus_p_and_preserve_the_mean(masks: str) -> None:
    model = Net(dropout_masks=masks).train()
    x = torch.ones(1000, 1000)
    for p in (0.10, 0.25):
        out = model._dropout(x, p)
        kept = out != 0
        # 1e6 draws: the standard error of the kept fraction is below 5e-4.
        assert kept.float().mean().item() == pytest.approx(1 - p, abs=3e-3)
        # Independent draws: neighbours (two halves of one 64-bit word for
        # pcg64) are both kept with probability (1 - p)^2.
        both = (kept[:, 0::2] & kept[:, 1::2]).float().mean().item()
        assert both == pytest.approx((1 - p) ** 2, abs=4e-3)
        assert out.mean().item() == pytest.approx(1.0, abs=5e-3)
        values = out.unique().tolist()
        assert values[0] == 0.0 and values[1:] == [pytest.approx(1 / (1 - p))]
    assert torch.equal(model.eval()._dropout(x, 0.25), x)


@pytest.mark.parametrize("masks", ["pcg64", "uniform"])
def test_dropout_masks_follow_torchs_generator(masks: str) -> None:
    """torch.manual_seed fixes the masks, and restoring the generator's
    state (what a checkpoint holds) draws the same masks again: a resumed
    run drops what a run never stopped drops."""
    model = Net(dropout_masks=masks).train()
    x = torch.ones(64, 32, 12, 12)
    torch.manual_seed(7)
    first = model._dropout(x, 0.10)
    state = torch.get_rng_state()
    second = model._dropout(x, 0.10)
    assert not torch.equal(first, second)
    torch.manual_seed(7)
    assert torch.equal(model._dropout(x, 0.10), first)
    torch.set_rng_state(state)
    assert torch.equal(model._dropout(x, 0.10), second)


def test_the_test_set_in_chunks_gives_each_images_output_bit_for_bit() -> None:
    """evaluate() runs a batch of 1,000 a chunk at a time: the outputs (and
    so the summed loss and the accuracy) are the whole batch's exactly."""
    torch.manual_seed(2)
    model = build_model(JobSpec(), CPU).eval()
    images = torch.randn(1000, 1, 28, 28, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        whole = model(images.contiguous(memory_format=torch.channels_last))
        chunked = mnist._forward_in_chunks(model, images, channels_last=True)
    assert torch.equal(whole, chunked)
