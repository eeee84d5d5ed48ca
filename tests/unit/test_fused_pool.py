"""performance.fused_pool (worker/fused_pool.py): the kernel the worker
compiles gives aten's max-pool + ReLU values and gradients bit for bit (ties,
windows the ReLU cuts, NaN and infinities included), the built-in model
trains the same weights with it, and whatever it does not take runs aten's
ops. Built once here, as a worker builds it (``python -m worker.fused_pool``)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from ddpo.schemas import JobSpec
from worker import fused_pool, mnist

CPU = torch.device("cpu")


@pytest.fixture(scope="module", params=list(fused_pool.BUILDS))
def built(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path]:
    """Each build this CPU runs (an AVX-512 CPU runs the AVX2 one too), compiled
    once for the module as a worker compiles it."""
    isa: str = request.param
    if not fused_pool.runs_here(isa):
        pytest.skip(f"this CPU lacks {isa}")
    if not fused_pool.can_compile():
        pytest.skip("no C++ compiler or ninja: workers here run aten's ops")
    directory = tmp_path_factory.mktemp("extensions")
    built = subprocess.run(
        [sys.executable, "-m", "worker.fused_pool", str(directory), "--isa", isa],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return isa, directory


@pytest.fixture
def kernel(built: tuple[str, Path]) -> Iterator[Path]:
    isa, directory = built
    fused_pool.disable("another build was loaded")
    assert fused_pool.load(directory, isa) is None
    assert f"the fused {isa} kernel" in fused_pool.status()
    try:
        yield directory
    finally:
        fused_pool.disable("the test is over")


def windows() -> torch.Tensor:
    """Conv2's output shape, with the windows that decide a max-pool's
    gradient: ties, all-negative and zero windows (the ReLU cuts them),
    NaN in each position, infinities."""
    torch.manual_seed(0)
    x = torch.randn(128, 32, 24, 24)
    x[0, 0, 0, 0:2] = 1.5  # a tie across a row: the first wins
    x[0, 0, 1, 0:2] = 1.5  # ... and down the window
    x[0, 1, 0:2, 2] = 0.7  # a tie down a column
    x[0, 1, 0:2, 3] = 0.2
    x[1, 1] = 0.0  # every window zero: cut by the ReLU
    x[2, 2] = -1.0  # every window negative
    x[3, 3, 0, 0] = float("nan")
    x[3, 3, 0, 3] = float("nan")
    x[3, 3, 1, 4] = float("nan")
    x[3, 3, 1, 7] = float("nan")
    x[3, 4, 0:2, 0:2] = float("nan")  # NaN everywhere: the last wins
    x[4, 4, 0, 0] = float("inf")
    x[4, 4, 0, 2] = float("-inf")
    return x.contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_gives_atens_values_and_gradients_bit_for_bit(
    kernel: Path, dtype: torch.dtype
) -> None:
    x = windows().to(dtype)  # bfloat16: bf16-mixed's activations
    theirs, ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    assert fused_pool.applies(ours)
    expected, got = F.relu(F.max_pool2d(theirs, 2)), fused_pool.pool_relu(ours)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(expected.isnan(), got.isnan())
    assert torch.equal(expected.nan_to_num(), got.nan_to_num())
    assert got.dtype == dtype
    grad = torch.randn_like(expected)
    expected.backward(grad)
    got.backward(grad)
    assert theirs.grad is not None and ours.grad is not None
    assert ours.grad.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(theirs.grad, ours.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# 0.25 is the model's; 0.2 scales by 1.25, whose bfloat16 products land
# halfway between two bfloat16 values often enough to test the ties' rounding.
@pytest.mark.parametrize("p", [None, 0.25, 0.2])
def test_the_nchw_kernel_gives_the_models_layout_and_dropout_bit_for_bit(
    kernel: Path, dtype: torch.dtype, p: float | None
) -> None:
    """What the model computes after conv2 on the other path: the pooled
    values copied to NCHW, then ``y * keep * scale`` (bfloat16: each
    product rounded as bfloat16 ops round it, ties to even), and the
    gradients back."""
    x = windows().to(dtype)
    theirs, ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    generator = torch.Generator().manual_seed(2)
    keep = torch.rand(128, 32, 12, 12, generator=generator) >= p if p is not None else None
    scale = 1.0 / (1.0 - p) if p is not None else 1.0
    expected = F.relu(F.max_pool2d(theirs, 2)).contiguous()
    if keep is not None:
        expected = expected * keep * scale
    got = fused_pool.pool_relu_nchw(ours, keep, scale)
    assert got.is_contiguous() and got.dtype == dtype
    assert torch.equal(expected.isnan(), got.isnan())
    # Bit for bit: the sign of each zero too.
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    assert torch.equal(expected.nan_to_num().view(bits), got.nan_to_num().view(bits))
    grad = (torch.randn(expected.shape, generator=generator) * 3).to(dtype)
    expected.backward(grad)
    got.backward(grad)
    assert theirs.grad is not None and ours.grad is not None
    assert ours.grad.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(theirs.grad.view(bits), ours.grad.view(bits))


def test_the_kernel_refuses_what_it_would_read_past(kernel: Path) -> None:
    for x in (
        windows().contiguous(),  # NCHW
        windows()[:, :, :23].contiguous(memory_format=torch.channels_last),  # an odd height
        windows()[:, :8].contiguous(memory_format=torch.channels_last),  # channels not in 16s
    ):
        for pooling in (fused_pool.pool_relu, fused_pool.pool_relu_nchw):
            with pytest.raises(ValueError, match="channels-last"):
                pooling(x)
    x = windows()
    for keep in (
        torch.ones(128, 32, 12, 11, dtype=torch.bool),  # another shape
        torch.ones(128, 32, 12, 12),  # not bool
        torch.ones(128, 12, 12, 32, dtype=torch.bool).permute(0, 3, 1, 2),  # not NCHW
    ):
        with pytest.raises(ValueError, match="keep must be"):
            fused_pool.pool_relu_nchw(x, keep, 2.0)


@pytest.mark.parametrize("masks", ["pcg64", "uniform", "bernoulli"])
def test_the_built_in_model_trains_the_same_weights_with_it(kernel: Path, masks: str) -> None:
    spec = JobSpec(performance={"dropout_masks": masks})  # fused_pool on by default
    assert spec.performance.fused_pool
    torch.manual_seed(0)
    fused = mnist.build_model(spec, CPU)
    aten = mnist.build_model(
        JobSpec(performance={"dropout_masks": masks, "fused_pool": False}), CPU
    )
    aten.load_state_dict(fused.state_dict())
    generator = torch.Generator().manual_seed(1)
    batches = [
        (
            torch.randn(64, 1, 28, 28, generator=generator).contiguous(
                memory_format=torch.channels_last
            ),
            torch.randint(0, 10, (64,), generator=generator),
        )
        for _ in range(3)
    ]
    used: list[bool] = []
    fused.conv2.register_forward_hook(lambda _m, _i, out: used.append(fused_pool.applies(out)))
    for model in (fused, aten):
        optimizer = mnist.build_optimizer(spec, model)
        for index, (images, target) in enumerate(batches):
            torch.manual_seed(index)  # the same dropout masks
            mnist.train_step(model, optimizer, images, target)
    assert used == [True] * 3  # it ran the kernel
    for p, q in zip(fused.parameters(), aten.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("masks", [None, "pcg64", "uniform", "bernoulli"])
def test_a_bf16_mixed_step_runs_the_kernel_with_atens_gradients(
    kernel: Path, masks: str | None
) -> None:
    """One bf16-mixed step, with no dropout (evaluation mode) or in training
    with each kind of mask: the kernel's dropout (F.dropout's own for
    ``bernoulli``) on the same masks as the other path's."""
    performance = {} if masks is None else {"dropout_masks": masks}
    torch.manual_seed(0)
    fused = mnist.build_model(JobSpec(performance=performance), CPU)
    aten = mnist.build_model(JobSpec(performance={**performance, "fused_pool": False}), CPU)
    aten.load_state_dict(fused.state_dict())
    if masks is None:
        fused.eval()
        aten.eval()
    images = torch.randn(32, 1, 28, 28).contiguous(memory_format=torch.channels_last)
    target = torch.randint(0, 10, (32,))
    used: list[bool] = []
    fused.conv2.register_forward_hook(lambda _m, _i, out: used.append(fused_pool.applies(out)))
    for model in (fused, aten):
        torch.manual_seed(7)  # the same masks
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.nll_loss(model(images), target)
        loss.backward()
    assert used == [True]
    for p, q in zip(fused.parameters(), aten.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        assert torch.equal(p.grad, q.grad)


@pytest.mark.parametrize(
    "shape, dtype, channels_last",
    [
        ((8, 32, 24, 24), torch.float16, True),  # fp16-mixed's (on GPUs anyway)
        ((8, 32, 24, 24), torch.float32, False),  # NCHW
        ((8, 8, 24, 24), torch.float32, True),  # channels not in sixteens
        ((8, 32, 23, 24), torch.float32, True),  # an odd height
    ],
)
def test_what_the_kernel_does_not_take_runs_atens_ops(
    kernel: Path, shape: tuple[int, ...], dtype: torch.dtype, channels_last: bool
) -> None:
    x = torch.randn(shape).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    assert not fused_pool.applies(x)


def test_a_machine_without_the_kernel_says_why(tmp_path: Path) -> None:
    fused_pool.disable("reset")
    why = fused_pool.load(tmp_path)
    if fused_pool.cpu_supports():
        assert why == f"not built in {tmp_path} yet"
    assert why is not None and why in fused_pool.status()
    assert fused_pool.load(None) == "no extensions directory"
    assert not fused_pool.applies(windows())  # so the model runs aten's ops
