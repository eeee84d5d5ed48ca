"""torch's Adadelta with its step over whole buffers.

A step of ``optim.Adadelta`` is eleven small tensor operations per
parameter, and the built-in model has eight parameters: about a hundred
dispatches a step, each a few microseconds of overhead around a few
microseconds of work. ``FlatAdadelta`` keeps the parameters, their gradients
and the optimizer's two running averages each in one flat buffer (every
parameter, gradient and state tensor a view into its buffer), so a step is
the same eleven operations once, on every element at the same time.

Elementwise, it is the same operations in the same order on the same values,
so the parameters come out bit for bit as ``optim.Adadelta``'s (tested). Its
``state_dict`` is Adadelta's, so checkpoints load either way. Whenever a
gradient is not the view it set up (DDP's ``gradient_as_bucket_view`` puts
its own there, or someone set it to None), it takes torch's step instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import optim
from torch.optim.optimizer import _get_scalar_dtype


class FlatAdadelta(optim.Adadelta):
    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1.0) -> None:
        super().__init__(params, lr=lr)
        self._flat: _Buffers | None = None
        self._flatten()

    def _flatten(self) -> None:
        """Move the parameters, gradients and state into flat buffers (their
        values kept), or leave them as they are where that cannot be done."""
        self._flat = None
        params = [p for group in self.param_groups for p in group["params"]]
        if len(self.param_groups) != 1 or not params:
            return
        if not all(_flattenable(p, params[0]) for p in params):
            return
        reference = params[0]
        total = sum(p.numel() for p in params)
        flat = _Buffers(
            data=torch.empty(total, dtype=reference.dtype, device=reference.device),
            grad=torch.zeros(total, dtype=reference.dtype, device=reference.device),
            square_avg=torch.zeros(total, dtype=reference.dtype, device=reference.device),
            acc_delta=torch.zeros(total, dtype=reference.dtype, device=reference.device),
            step=torch.zeros(len(params), dtype=_get_scalar_dtype()),
            params=params,
        )
        offset = 0
        for index, p in enumerate(params):
            shape, stride = p.shape, p.stride()
            views = {
                name: buffer.as_strided(shape, stride, offset)
                for name, buffer in (
                    ("data", flat.data),
                    ("grad", flat.grad),
                    ("square_avg", flat.square_avg),
                    ("acc_delta", flat.acc_delta),
                )
            }
            views["data"].copy_(p.detach())
            if p.grad is not None:
                views["grad"].copy_(p.grad)
            state = self.state[p]
            for name in ("square_avg", "acc_delta"):
                if name in state:
                    views[name].copy_(state[name])
            if "step" in state:
                flat.step[index].copy_(state["step"])
            # The parameter keeps its identity (modules, DDP and autograd
            # hold it); only the memory under it moves.
            p.data = views["data"]
            p.grad = views["grad"]
            state["square_avg"] = views["square_avg"]
            state["acc_delta"] = views["acc_delta"]
            state["step"] = flat.step[index]
            flat.grad_ptrs.append(views["grad"].data_ptr())
            offset += p.numel()
        self._flat = flat

    def _usable(self) -> _Buffers | None:
        flat = self._flat
        if flat is None:
            return None
        group = self.param_groups[0]
        if group["weight_decay"] != 0 or group["maximize"] or group["differentiable"]:
            return None
        if group.get("capturable"):
            return None
        for p, pointer in zip(flat.params, flat.grad_ptrs, strict=True):
            if p.grad is None or p.grad.data_ptr() != pointer:
                return None
        return flat

    def zero_grad(self, set_to_none: bool = True) -> None:
        # Zeroed in place, not set to None: autograd then adds each new
        # gradient into its view of the flat buffer (0 + g is g).
        flat = self._usable()
        if flat is None:
            super().zero_grad(set_to_none)
            return
        flat.grad.zero_()

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        flat = self._usable()
        if flat is None:
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        group = self.param_groups[0]
        lr, rho, eps = group["lr"], group["rho"], group["eps"]
        if isinstance(lr, torch.Tensor):
            lr = lr.item()
        grad = flat.grad
        # optim.Adadelta's single-tensor step, line for line, on every
        # parameter at once.
        flat.step.add_(1)
        flat.square_avg.mul_(rho).addcmul_(grad, grad, value=1 - rho)
        std = flat.square_avg.add(eps).sqrt_()
        delta = flat.acc_delta.add(eps).sqrt_()
        delta.div_(std).mul_(grad)
        flat.acc_delta.mul_(rho).addcmul_(delta, delta, value=1 - rho)
        flat.data.add_(delta, alpha=-lr)
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        # The loaded state is new tensors: back into the flat buffers.
        self._flatten()


class _Buffers:
    def __init__(
        self,
        *,
        data: torch.Tensor,
        grad: torch.Tensor,
        square_avg: torch.Tensor,
        acc_delta: torch.Tensor,
        step: torch.Tensor,
        params: list[torch.Tensor],
    ) -> None:
        self.data, self.grad = data, grad
        self.square_avg, self.acc_delta, self.step = square_avg, acc_delta, step
        self.params = params
        self.grad_ptrs: list[int] = []


def _flattenable(p: torch.Tensor, reference: torch.Tensor) -> bool:
    """A dense parameter laid out contiguously in some dimension order (so a
    view of a flat chunk can have its strides), of the reference's dtype and
    device."""
    if p.is_sparse or p.dtype != reference.dtype or p.device != reference.device:
        return False
    if p.dim() == 4 and p.is_contiguous(memory_format=torch.channels_last):
        return True
    return p.is_contiguous()
