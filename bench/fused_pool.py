"""What a fused max-pool + ReLU kernel would buy the built-in trainer's step:
an experiment, not a code path jobs take.

aten's channels-last max-pool keeps int64 indices and its backward
zero-fills the whole 9.4 MB input gradient before scattering into it
(about 2 ms of a 14-15 ms step here). This builds a small AVX-512 kernel
(torch.utils.cpp_extension, g++ and ninja; about 20 s the first time) that
keeps a one-byte code per output instead, writes the input gradient in one
pass and applies the ReLU that follows the pool (``pool_before_relu``) on
the way; checks it gives aten's values and gradients bit for bit (ties
included); then times the step with it against the default step,
alternating in one process.

    python -m bench.fused_pool --rounds 30

Needs a CPU with AVX-512 (F, BW, VL).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.cpp_extension import load

from ddpo.schemas import JobSpec
from worker import mnist
from worker._process import keep_freed_memory


def build() -> Any:
    torch_lib = Path(torch.__file__).parent / "lib"
    return load(
        "ddpo_fused_pool_bench",
        sources=[str(Path(__file__).with_suffix(".cpp"))],
        extra_cflags=["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-fopenmp"],
        # at::parallel_for on torch's own OpenMP runtime (the wheel's libgomp):
        # a second runtime would start threads of its own to fight torch's
        # for the cores (and did: the step ran 1.37x slower).
        extra_ldflags=[f"-L{torch_lib}", "-l:libgomp.so.1", f"-Wl,-rpath,{torch_lib}"],
    )


def fused(ext: Any) -> type[torch.autograd.Function]:
    class PoolRelu(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            out, code = ext.fwd(x)
            ctx.save_for_backward(code)
            ctx.size = (x.shape[2], x.shape[3])
            return torch.as_tensor(out)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            (code,) = ctx.saved_tensors
            return torch.as_tensor(ext.bwd(grad, code, *ctx.size))

    return PoolRelu


def check(pool_relu: type[torch.autograd.Function]) -> bool:
    torch.manual_seed(0)
    x = torch.randn(128, 32, 24, 24)
    x[0, 0, 0, :2] = 1.5  # a window of ties: the first in row-major order wins
    x[0, 0, 1, :2] = 1.5
    x[1, 1] = 0.0  # windows the ReLU cuts
    x = x.contiguous(memory_format=torch.channels_last)
    theirs, ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    expected, got = F.relu(F.max_pool2d(theirs, 2)), pool_relu.apply(ours)
    grad = torch.randn_like(expected)
    expected.backward(grad)
    got.backward(grad)
    assert theirs.grad is not None and ours.grad is not None
    return torch.equal(expected, got) and torch.equal(theirs.grad, ours.grad)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    keep_freed_memory()
    started = time.perf_counter()
    pool_relu = fused(build())
    print(f"built and loaded in {time.perf_counter() - started:.1f} s")
    print(f"aten's values and gradients bit for bit: {check(pool_relu)}")

    class FusedNet(mnist.Net):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = F.relu(self.conv1(x), inplace=self.inplace_relu)
            x = pool_relu.apply(self.conv2(x))
            x = self._dropout(mnist._nchw(x), self.p1)
            x = torch.flatten(x, 1)
            x = self._dropout(F.relu(self.fc1(x)), self.p2)
            return F.log_softmax(self.fc2(x), dim=1)

    spec = JobSpec()
    generator = torch.Generator().manual_seed(1)
    data = torch.randn(128, 1, 28, 28, generator=generator).contiguous(
        memory_format=torch.channels_last
    )
    target = torch.randint(0, 10, (128,), generator=generator)
    steps: dict[str, Callable[[], torch.Tensor]] = {}
    for name, cls in (("defaults", mnist.Net), ("fused pool+ReLU", FusedNet)):
        torch.manual_seed(0)
        model = cls(pool_before_relu=True, dropout_masks="pcg64", inplace_relu=True)
        model = model.to(memory_format=torch.channels_last)
        optimizer = mnist.build_optimizer(spec, model)
        steps[name] = functools.partial(mnist.train_step, model, optimizer, data, target)
    for step in steps.values():
        for _ in range(10):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for index in range(args.rounds):
        for name in list(steps) if index % 2 == 0 else list(steps)[::-1]:
            began = time.perf_counter()
            for _ in range(args.steps):
                steps[name]()
            times[name].append((time.perf_counter() - began) / args.steps)
    base = times["defaults"]
    for name, values in times.items():
        ratios = [v / b for v, b in zip(values, base, strict=True)]
        print(
            f"{name:<16} median {1e3 * statistics.median(values):6.2f} ms a step, "
            f"{statistics.median(ratios):.3f} of the defaults', faster in "
            f"{sum(r < 1 for r in ratios)}/{args.rounds} rounds"
        )


if __name__ == "__main__":
    main()
