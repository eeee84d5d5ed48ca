"""The search of a sweep, as pure functions of its trials: which values the
next trial gets (Optuna's samplers, through ask-and-tell), whether a
running trial should stop early (Optuna's pruners), which trial is best.

The state lives in our database, one row per trial (api/core/sweeps.py):
each decision rebuilds an in-memory Optuna study from those rows, asks it,
and writes back what Optuna keeps on a trial (its system attributes: ASHA's
rung values, the grid's point). So a sweep survives a server restart and
runs under several servers, each deciding inside the transaction that
holds the sweep's row; and a sampler is seeded with the sweep's seed plus
the trial's number, so the same sweep asks the same values whichever
server asks, and after any restart.

No I/O here: tests/unit/test_sweeps.py drives it with plain records."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState as OptunaState
from optuna.trial import create_trial

from ddpo.schemas import JobSpec, TrainResult
from ddpo.schemas.protocol import ProgressReport
from ddpo.schemas.sweep import (
    ARG_PREFIX,
    PARAM_PREFIX,
    Choice,
    Choices,
    Dimension,
    FloatRange,
    IntRange,
    SweepCreate,
    TrialState,
)

# Optuna logs each trial it is told of at INFO; ours say what matters.
optuna.logging.set_verbosity(optuna.logging.WARNING)
log = logging.getLogger(__name__)

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


def distribution(dimension: Dimension) -> BaseDistribution:
    if isinstance(dimension, FloatRange):
        return FloatDistribution(
            dimension.low, dimension.high, log=dimension.log, step=dimension.step
        )
    if isinstance(dimension, IntRange):
        step = None if dimension.log else dimension.step
        return IntDistribution(dimension.low, dimension.high, log=dimension.log, step=step or 1)
    return CategoricalDistribution(dimension.choices)


def distributions(create: SweepCreate) -> dict[str, BaseDistribution]:
    return {name: distribution(d) for name, d in create.space.items()}


def _grid(create: SweepCreate) -> dict[str, list[Choice]]:
    grid: dict[str, list[Choice]] = {}
    for name, dimension in create.space.items():
        if isinstance(dimension, Choices):
            grid[name] = list(dimension.choices)
        elif isinstance(dimension, IntRange):
            grid[name] = list(range(dimension.low, dimension.high + 1, dimension.step))
        else:  # refused at submit (SweepCreate)
            raise ValueError(f"space.{name}: a grid takes no float range")
    return grid


def sampler_for(create: SweepCreate, number: int) -> optuna.samplers.BaseSampler:
    """Seeded with the sweep's seed and the trial's number: the same trial
    gets the same values, whoever asks and however often the server
    restarted before."""
    seed = (create.sampler.seed + number) % 2**32
    if create.sampler.kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if create.sampler.kind == "grid":
        return optuna.samplers.GridSampler(_grid(create), seed=create.sampler.seed)
    return optuna.samplers.TPESampler(seed=seed)


def pruner_for(create: SweepCreate) -> optuna.pruners.BasePruner:
    pruner = create.pruner
    if pruner.kind == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=pruner.grace_steps or "auto",
            reduction_factor=pruner.reduction_factor,
        )
    if pruner.kind == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=pruner.startup_trials, n_warmup_steps=pruner.warmup_steps
        )
    return optuna.pruners.NopPruner()


def _frozen(record: TrialRecord, dists: Mapping[str, BaseDistribution]) -> optuna.trial.FrozenTrial:
    reports = {step: math.nan if v is None else v for step, v in record.reports.items()}
    params = {k: v for k, v in record.params.items() if k in dists}
    used = {k: dists[k] for k in params}
    if record.state is TrialState.SUCCEEDED and record.value is not None:
        return create_trial(
            state=OptunaState.COMPLETE,
            value=record.value,
            params=params,
            distributions=used,
            intermediate_values=reports,
            system_attrs=record.system_attrs,
        )
    if record.state is TrialState.PRUNED:
        state = OptunaState.PRUNED
    elif record.state.is_terminal():
        state = OptunaState.FAIL  # failed, cancelled, or succeeded with no value
    else:
        state = OptunaState.RUNNING
    return create_trial(
        state=state,
        params=params,
        distributions=used,
        intermediate_values=reports,
        system_attrs=record.system_attrs,
    )


def study_of(create: SweepCreate, trials: Iterable[TrialRecord], number: int = 0) -> optuna.Study:
    """An in-memory study holding the sweep's trials in number order."""
    dists = distributions(create)
    study = optuna.create_study(
        direction=create.objective.direction,
        sampler=sampler_for(create, number),
        pruner=pruner_for(create),
    )
    for record in sorted(trials, key=lambda t: t.number):
        study.add_trial(_frozen(record, dists))
    return study


def ask(
    create: SweepCreate, trials: Sequence[TrialRecord]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The next trial's values and the system attributes its sampler keeps
    on it (the grid's point)."""
    number = len(trials)
    study = study_of(create, trials, number)
    trial = study.ask(distributions(create))
    frozen = study._storage.get_trial(trial._trial_id)  # its system attrs, as Optuna set them
    return dict(trial.params), dict(frozen.system_attrs)


def should_prune(
    create: SweepCreate, trials: Sequence[TrialRecord], number: int
) -> tuple[bool, dict[str, Any]]:
    """Whether trial ``number`` (running, with its reports so far) should
    stop now, and its system attributes after the pruner judged it (ASHA
    notes each rung's value there, which later trials are compared with)."""
    mine = next(t for t in trials if t.number == number)
    if create.pruner.kind == "none" or not mine.reports:
        return False, dict(mine.system_attrs)
    study = study_of(create, trials, number)
    frozen = next(t for t in study.get_trials(deepcopy=False) if t.number == number)
    pruned = study.pruner.prune(study, frozen)
    after = study._storage.get_trial(frozen._trial_id)
    return bool(pruned), dict(after.system_attrs)


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
