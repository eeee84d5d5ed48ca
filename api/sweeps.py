"""A sweep's bookkeeping, as pure functions of its trials: a trial's spec
from the base spec and its values, its reports of the objective, its final
value, the best trial, how many to start. The search itself (which values,
which trial stops early) is Optuna's, in api/search.py.

No I/O here: tests/unit/test_sweeps.py drives it with plain records."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddpo.schemas import JobSpec, TrainResult
from ddpo.schemas.protocol import ProgressReport
from ddpo.schemas.sweep import (
    ARG_PREFIX,
    PARAM_PREFIX,
    Choices,
    SweepCreate,
    TrialState,
)

# Reports kept per trial: enough for every rung of a long run; beyond it,
# every other one of the older half is dropped (the newest stay whole).
MAX_REPORTS = 2000


@dataclass
class TrialRecord:
    """What a decision needs of one trial (a Trial row has these)."""

    number: int
    state: TrialState
    params: dict[str, Any]
    reports: dict[int, float | None] = field(default_factory=dict)
    system_attrs: dict[str, Any] = field(default_factory=dict)
    value: float | None = None


def trial_spec(base: JobSpec, params: Mapping[str, Any], name: str) -> JobSpec:
    """The base spec with one trial's values in it (validated again: a value
    must fit the spec's own bounds)."""
    data = base.model_dump(mode="json")
    data["name"] = name[:128]
    for key, value in params.items():
        if key.startswith(PARAM_PREFIX):
            data["params"][key.removeprefix(PARAM_PREFIX)] = value
        elif key.startswith(ARG_PREFIX):
            data["script"]["args"] += [f"--{key.removeprefix(ARG_PREFIX)}", _arg(value)]
        else:
            data[key] = value
    return JobSpec.model_validate(data)


def _arg(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def corners(create: SweepCreate) -> list[tuple[str, Any]]:
    """Each dimension's extreme values and every choice: a spec with any of
    them must be valid for the sweep to be (checked at submit)."""
    found: list[tuple[str, Any]] = []
    for name, dimension in create.space.items():
        if isinstance(dimension, Choices):
            found += [(name, choice) for choice in dimension.choices]
        else:
            found += [(name, dimension.low), (name, dimension.high)]
    return found


def step_of(report: ProgressReport) -> int:
    """A report's step: the trainer's own, else batches since the start."""
    if report.step is not None:
        return report.step
    return (report.epoch - 1) * report.batches_per_epoch + report.batch


def reported(metric: str, report: ProgressReport) -> tuple[bool, float | None]:
    """Whether the report carries the objective, and its value (None: not a
    finite number, which a pruner takes as the worst)."""
    if metric == "loss":
        value = report.loss
        present = True
    else:
        present = metric in report.metrics
        value = report.metrics.get(metric)
    if value is not None and not math.isfinite(value):
        value = None
    return present, value


def add_reports(reports: dict[int, float | None], new: Mapping[int, float | None]) -> None:
    reports.update(new)
    if len(reports) > MAX_REPORTS:
        steps = sorted(reports)
        older = steps[: len(steps) // 2]
        for step in older[1::2]:
            del reports[step]


def final_value(
    metric: str, result: TrainResult | None, reports: Mapping[int, float | None]
) -> float | None:
    """A finished trial's objective: its result's field of that name when
    the result has one, else its last report."""
    if result is not None and metric in TrainResult.model_fields:
        value = getattr(result, metric)
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    if reports:
        return reports[max(reports)]
    return None


def best(create: SweepCreate, trials: Iterable[TrialRecord]) -> TrialRecord | None:
    """The succeeded trial with the best objective (the first, on a tie)."""
    done = [
        t
        for t in trials
        if t.state is TrialState.SUCCEEDED and t.value is not None and math.isfinite(t.value)
    ]
    if not done:
        return None
    sign = 1.0 if create.objective.direction == "minimize" else -1.0
    return min(done, key=lambda t: (sign * (t.value or 0.0), t.number))


def to_start(create: SweepCreate, trials: Sequence[TrialRecord]) -> int:
    """Trials to start now: up to max_concurrent unfinished, max_trials in all."""
    active = sum(not t.state.is_terminal() for t in trials)
    return max(0, min(create.max_concurrent - active, create.max_trials - len(trials)))
