"""Comparing trained states tensor by tensor."""

from __future__ import annotations

from typing import Any

import torch


def assert_same_tensors(left: Any, right: Any, where: str = "") -> int:
    """Every tensor in two nested states equal, bit for bit; how many."""
    if isinstance(left, torch.Tensor):
        assert isinstance(right, torch.Tensor) and torch.equal(left, right), where
        return 1
    if isinstance(left, dict):
        assert left.keys() == right.keys(), where
        return sum(assert_same_tensors(left[k], right[k], f"{where}.{k}") for k in left)
    if isinstance(left, (list, tuple)):
        assert len(left) == len(right), where
        pairs = enumerate(zip(left, right, strict=True))
        return sum(assert_same_tensors(a, b, f"{where}[{i}]") for i, (a, b) in pairs)
    assert left == right, where
    return 0
