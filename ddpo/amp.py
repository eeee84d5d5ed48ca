"""Mixed precision as a job's ``performance.precision`` names it, for the
built-in trainer, plugins (``ctx.autocast()``, ``ctx.grad_scaler()``) and
scripts (``ddpo.autocast(device)``): one place that turns the name into
torch's autocast and gradient scaler, so all three run the same maths.

Imported only by code that trains (it imports torch)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed")
_DTYPES = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}


def _known(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")
    return precision


def autocast(precision: str, device_type: str) -> contextlib.AbstractContextManager[Any]:
    """The forward pass and loss under autocast in the precision's dtype;
    fp32: nothing at all (the recipe's maths, bit for bit)."""
    dtype = _DTYPES.get(_known(precision))
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=dtype)


def grad_scaler(precision: str, device_type: str) -> torch.amp.GradScaler:
    """fp16's loss scaler (its gradients underflow without one); for the
    other precisions a disabled one, whose calls pass through: a loop
    written with it runs in any precision."""
    return torch.amp.GradScaler(device_type, enabled=_known(precision) == "fp16-mixed")
