"""The search of a sweep, through Optuna's ask-and-tell: which values the
next trial gets (its samplers), whether a running trial should stop early
(its pruners).

The state lives in our database, one row per trial (api/core/sweeps.py):
each decision rebuilds an in-memory Optuna study from those rows, asks it,
and writes back what Optuna keeps on a trial (its system attributes: ASHA's
rung values, the grid's point). So a sweep survives a server restart and
runs under several servers, each deciding inside the transaction that
holds the sweep's row; and a sampler is seeded with the sweep's seed plus
the trial's number, so the same sweep asks the same values whichever
server asks, and after any restart.

Imported with the first sweep's decision (api/core/sweeps.py): Optuna
brings numpy and its BLAS threads, which a server running no sweep does
without. No I/O here: tests/unit/test_sweeps.py drives it with records."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
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

from api.sweeps import TrialRecord
from ddpo.schemas.sweep import (
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


def distribution(dimension: Dimension) -> BaseDistribution:
    if isinstance(dimension, FloatRange):
        return FloatDistribution(
            dimension.low, dimension.high, log=dimension.log, step=dimension.step
        )
    if isinstance(dimension, IntRange):  # a log scale has step 1 (SweepCreate)
        return IntDistribution(
            dimension.low, dimension.high, log=dimension.log, step=dimension.step
        )
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


def pruned_at(
    create: SweepCreate, trials: Sequence[TrialRecord], number: int, steps: Iterable[int]
) -> tuple[int | None, dict[str, Any]]:
    """The first of ``steps`` (trial ``number``'s new reports, its values in
    its record) at which the trial should stop, or None; and its system
    attributes after the pruner judged it (ASHA notes each rung's value
    there, which later trials are compared with).

    Each step is judged as if its report had come alone, with the trial's
    values up to it, so reports that arrive together (a node sends what
    rank 0 said since its last send) are judged where reports one by one
    would be. Judged only at the latest, a trial's value some steps past a
    rung would be noted as the rung's, and an objective that is not
    monotonic in steps (an epoch's mean loss so far starts again each
    epoch) compared between trials at different steps: that pruned the
    best learning rates of README's sweep in some runs and not in others.
    Only the steps where the pruner may decide are judged (:func:`judged`):
    a batch of thousands of reports costs the writer a few judgements."""
    mine = next(t for t in trials if t.number == number)
    arrived = {s for s in steps if s in mine.reports}
    new = sorted(arrived)
    judging = judged(create, [s for s in mine.reports if s not in arrived], new)
    if create.pruner.kind == "none" or not judging:
        return None, dict(mine.system_attrs)
    before = replace(mine, reports={s: v for s, v in mine.reports.items() if s < judging[0]})
    study = study_of(create, [*(t for t in trials if t.number != number), before], number)
    trial_id = next(t for t in study.get_trials(deepcopy=False) if t.number == number)._trial_id
    storage = study._storage
    for step in judging:
        value = mine.reports[step]
        storage.set_trial_intermediate_value(trial_id, step, math.nan if value is None else value)
        if study.pruner.prune(study, storage.get_trial(trial_id)):
            return step, dict(storage.get_trial(trial_id).system_attrs)
    return None, dict(storage.get_trial(trial_id).system_attrs)


# A pruner that may decide at any step (the median pruner, ASHA with its
# first rung left to Optuna) judges this many new steps one by one at
# most; a batch of more is judged at its latest, with every value before.
JUDGED_ONE_BY_ONE = 8


def judged(create: SweepCreate, earlier: Iterable[int], new: Sequence[int]) -> list[int]:
    """Of a trial's ``new`` steps (ascending; ``earlier``: the steps it
    reported before), those its pruner is asked about, in order.

    ASHA decides only where a report first reaches a rung (the grace steps
    times the reduction factor to the power of the rung), and reads no
    value but that report's: asked there alone, it decides as it would
    asked at every step. Another pruner (the median's reads every value up
    to the step) is asked at each, or at the latest of a large batch."""
    pruner = create.pruner
    if pruner.kind == "asha" and pruner.grace_steps is not None:
        seen = sorted({*earlier, *new})
        asked = []
        for step in new:
            at = bisect.bisect_left(seen, step)
            previous = seen[at - 1] if at else -1
            rung = pruner.grace_steps
            while rung <= previous:
                rung *= pruner.reduction_factor
            if rung <= step:
                asked.append(step)
        return asked
    return list(new) if len(new) <= JUDGED_ONE_BY_ONE else list(new[-1:])
