"""The cooperative stop, as the ranks see it: the job has been asked to stop
(preempted, drained, resized), and every rank must stop after the same step,
or the next collective waits forever for the ranks that went on.

Each rank knows only its own wish (its launcher's word reaches the ranks of
one machine, not all at once). Every :data:`CHECK_EVERY` steps the ranks
agree: an all-reduce of a one-element flag (MAX), so that all stop after
that step if any was asked. Between agreements a wish waits: a stop comes at
most ``CHECK_EVERY - 1`` steps after it was asked, and loses no step (the
checkpoint is taken where the ranks stop).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

# Steps between agreements: one all-reduce of 4 bytes took 0.37-0.43 ms
# on gloo over loopback against 70 ms for a step of the built-in trainer,
# so one every 10 steps costs about 0.06% of the training
# (bench/stop_agreement.py, BENCHMARKS.md).
CHECK_EVERY = 10


class StopAgreement:
    """``should_stop`` for one rank: called once per step, the same number
    of times on every rank."""

    def __init__(
        self,
        wish: Callable[[], bool],
        device: torch.device,
        every: int = CHECK_EVERY,
    ) -> None:
        self._wish = wish
        self._device = device
        self._every = every
        self._calls = 0
        self._agreed = False

    @property
    def agreed(self) -> bool:
        """Whether the ranks agreed to stop (so the trainer returned early)."""
        return self._agreed

    def should_stop(self) -> bool:
        if self._agreed:
            return True
        self._calls += 1
        if self._calls % self._every:
            return False
        flag = torch.tensor([1 if self._wish() else 0], dtype=torch.int32, device=self._device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self._agreed = bool(flag.item())
        return self._agreed
