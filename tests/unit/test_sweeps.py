"""A sweep's search and bookkeeping as pure functions of its trial records
(api/search.py, api/sweeps.py): what Optuna asks and prunes, rebuilt from
rows alone."""

from __future__ import annotations

import random
from typing import Any

import pytest
from pydantic import ValidationError

from api import search, sweeps
from api.sweeps import TrialRecord
from ddpo.schemas import JobSpec, TrainResult
from ddpo.schemas.sweep import SweepCreate, TrialState

LR = {"lr": {"type": "float", "low": 0.01, "high": 5, "log": True}}


def create(**fields: Any) -> SweepCreate:
    body: dict[str, Any] = {"spec": {}, "space": LR, "max_trials": 10}
    body.update(fields)
    return SweepCreate.model_validate(body)


def done(number: int, value: float, reports: dict[int, float | None] | None = None) -> TrialRecord:
    return TrialRecord(
        number=number,
        state=TrialState.SUCCEEDED,
        params={"lr": 0.1 * (number + 1)},
        reports=reports or {},
        value=value,
    )


def test_the_same_trials_ask_the_same_values_and_another_seed_others() -> None:
    sweep = create(sampler={"kind": "tpe", "seed": 4})
    history = [done(0, 0.5), done(1, 0.3)]
    first, _ = search.ask(sweep, history)
    again, _ = search.ask(sweep, history)
    other, _ = search.ask(create(sampler={"kind": "tpe", "seed": 5}), history)
    assert first == again and first != other
    assert 0.01 <= first["lr"] <= 5


def test_a_grid_visits_every_point_once() -> None:
    space = {
        "batch_size": {"type": "int", "low": 32, "high": 96, "step": 32},
        "params.act": {"type": "categorical", "choices": ["relu", "gelu"]},
    }
    sweep = create(space=space, sampler={"kind": "grid"}, max_trials=6)
    records: list[TrialRecord] = []
    for number in range(6):
        params, attrs = search.ask(sweep, records)
        assert "grid_id" in attrs
        records.append(TrialRecord(number, TrialState.RUNNING, params, system_attrs=attrs))
    points = {(r.params["batch_size"], r.params["params.act"]) for r in records}
    assert points == {(b, a) for b in (32, 64, 96) for a in ("relu", "gelu")}


def test_asha_stops_a_trial_worse_than_those_before_it_at_a_rung() -> None:
    sweep = create(pruner={"kind": "asha", "reduction_factor": 2, "grace_steps": 10})
    before = [
        done(0, 0.4, {11: 0.5}),
        done(1, 0.3, {11: 0.6}),
    ]
    # ASHA notes each trial's value at each rung it reached.
    for record, value in zip(before, (0.5, 0.6), strict=True):
        record.system_attrs = {"completed_rung_0": value}
    poor = TrialRecord(2, TrialState.RUNNING, {"lr": 4.0}, reports={11: 2.0})
    step, attrs = search.pruned_at(sweep, [*before, poor], 2, [11])
    assert step == 11 and attrs["completed_rung_0"] == 2.0
    good = TrialRecord(2, TrialState.RUNNING, {"lr": 0.5}, reports={11: 0.2})
    assert search.pruned_at(sweep, [*before, good], 2, [11])[0] is None
    # Before its first rung no trial is judged; a diverged one is stopped.
    early = TrialRecord(2, TrialState.RUNNING, {"lr": 4.0}, reports={5: 9.0})
    assert search.pruned_at(sweep, [*before, early], 2, [5])[0] is None
    diverged = TrialRecord(2, TrialState.RUNNING, {"lr": 5.0}, reports={11: None})
    assert search.pruned_at(sweep, [*before, diverged], 2, [11])[0] is not None


def test_reports_that_arrive_together_are_judged_as_if_they_came_one_by_one() -> None:
    # Rungs at steps 10, 30 and 90. The objective is an epoch's mean loss so
    # far: at step 41, one batch into epoch 2, it is far below the mean of
    # epoch 1's first 31 steps, so it must not stand for the value at 30.
    sweep = create(pruner={"kind": "asha", "reduction_factor": 3, "grace_steps": 10})
    before = [done(0, 0.4, {11: 1.2, 31: 0.5}), done(1, 0.3, {11: 1.3, 31: 0.6})]
    for record, rungs in zip(before, ((1.2, 0.5), (1.3, 0.6)), strict=True):
        record.system_attrs = {f"completed_rung_{k}": v for k, v in enumerate(rungs)}
    reports: dict[int, float | None] = {11: 1.0, 21: 0.9, 31: 0.8, 40: 0.7, 41: 0.3}

    attrs: dict[str, Any] = {}
    one_by_one = None
    for step in reports:
        upto = {s: v for s, v in reports.items() if s <= step}
        mine = TrialRecord(2, TrialState.RUNNING, {"lr": 0.1}, upto, attrs)
        one_by_one, attrs = search.pruned_at(sweep, [*before, mine], 2, [step])
        if one_by_one is not None:
            break
    assert one_by_one == 31 and attrs == {"completed_rung_0": 1.0, "completed_rung_1": 0.8}

    together = TrialRecord(2, TrialState.RUNNING, {"lr": 0.1}, reports)
    assert search.pruned_at(sweep, [*before, together], 2, list(reports)) == (31, attrs)
    # Sent in two batches, the second holding the rung's report and later ones.
    first, attrs = search.pruned_at(sweep, [*before, together], 2, [11, 21])
    assert first is None and attrs == {"completed_rung_0": 1.0}
    together.system_attrs = attrs
    assert search.pruned_at(sweep, [*before, together], 2, [31, 40, 41]) == (
        31,
        {"completed_rung_0": 1.0, "completed_rung_1": 0.8},
    )


def test_asha_asked_only_where_reports_reach_a_rung_decides_as_if_asked_at_every_step() -> None:
    rng = random.Random(7)
    for _ in range(150):
        factor, grace = rng.choice((2, 3, 4)), rng.choice((1, 5, 10))
        sweep = create(pruner={"kind": "asha", "reduction_factor": factor, "grace_steps": grace})
        before = []
        for number in range(rng.randint(0, 5)):
            record = done(number, rng.random(), {})
            record.system_attrs = {f"completed_rung_{k}": rng.random() for k in range(3)}
            before.append(record)
        number = len(before)
        steps = sorted(rng.sample(range(1, 300), rng.randint(1, 40)))
        reports: dict[int, float | None] = {
            s: None if rng.random() < 0.03 else rng.random() for s in steps
        }

        # Asked at every step, as the reports would be one by one.
        attrs: dict[str, Any] = {}
        asked = None
        for step in steps:
            upto = {s: v for s, v in reports.items() if s <= step}
            mine = TrialRecord(number, TrialState.RUNNING, {"lr": 0.1}, upto, attrs)
            asked, attrs = _asked_at(sweep, [*before, mine], number, step)
            if asked is not None:
                break

        together = TrialRecord(number, TrialState.RUNNING, {"lr": 0.1}, reports)
        assert search.pruned_at(sweep, [*before, together], number, steps) == (asked, attrs)


def _asked_at(
    sweep: SweepCreate, records: list[TrialRecord], number: int, step: int
) -> tuple[int | None, dict[str, Any]]:
    """Optuna's pruner asked about ``step`` itself, however far from a rung."""
    study = search.study_of(sweep, records, number)
    frozen = next(t for t in study.get_trials(deepcopy=False) if t.number == number)
    assert frozen.last_step == step
    pruned = study.pruner.prune(study, frozen)
    after = dict(study._storage.get_trial(frozen._trial_id).system_attrs)
    return (step if pruned else None), after


def test_a_batch_of_thousands_of_reports_is_judged_a_few_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[int] = []
    real = search.pruner_for

    def counting(create: SweepCreate) -> Any:
        pruner = real(create)
        prune = pruner.prune

        def counted(study: Any, trial: Any) -> bool:
            asked.append(trial.last_step)
            return bool(prune(study, trial))

        pruner.prune = counted  # type: ignore[method-assign]
        return pruner

    monkeypatch.setattr(search, "pruner_for", counting)
    steps = list(range(1, 10_001))
    reports: dict[int, float | None] = {s: 1.0 for s in steps}
    flood = TrialRecord(1, TrialState.RUNNING, {"lr": 0.1}, reports)
    asha = create(pruner={"kind": "asha", "reduction_factor": 3, "grace_steps": 10})
    assert search.pruned_at(asha, [done(0, 0.1), flood], 1, steps)[0] is None
    assert asked == [10, 30, 90, 270, 810, 2430, 7290]  # where a report reaches a rung
    asked.clear()
    median = create(pruner={"kind": "median", "startup_trials": 1})
    assert search.pruned_at(median, [done(0, 0.1, {10_000: 2.0}), flood], 1, steps)[0] is None
    assert asked == [10_000]  # the latest, with every value before it
    asked.clear()
    few = steps[: search.JUDGED_ONE_BY_ONE]
    assert search.pruned_at(median, [done(0, 0.1, {5: 0.5}), flood], 1, few)[0] == 5
    assert asked == [1, 2, 3, 4, 5]  # a few, one by one, to the first that stops it


def test_no_pruner_stops_nothing() -> None:
    poor = TrialRecord(1, TrialState.RUNNING, {"lr": 4.0}, reports={11: 99.0})
    assert search.pruned_at(create(), [done(0, 0.1, {11: 0.1}), poor], 1, [11])[0] is None


def test_the_median_pruner_waits_for_its_startup_trials() -> None:
    sweep = create(pruner={"kind": "median", "startup_trials": 2})
    one = [done(0, 0.1, {10: 0.1})]
    poor = TrialRecord(1, TrialState.RUNNING, {"lr": 4.0}, reports={10: 5.0})
    assert search.pruned_at(sweep, [*one, poor], 1, [10])[0] is None
    two = [*one, done(1, 0.2, {10: 0.2})]
    poor = TrialRecord(2, TrialState.RUNNING, {"lr": 4.0}, reports={10: 5.0})
    assert search.pruned_at(sweep, [*two, poor], 2, [10])[0] is not None


def test_a_trials_spec_carries_its_values() -> None:
    base = JobSpec.model_validate({"params": {"width": 8}, "epochs": 2})
    spec = sweeps.trial_spec(base, {"lr": 0.2, "seed": 3, "params.depth": 4}, "s: trial 0")
    assert (spec.lr, spec.seed, spec.params, spec.name) == (
        0.2,
        3,
        {"width": 8, "depth": 4},
        "s: trial 0",
    )
    script = JobSpec.model_validate({"script": {"path": "t.py", "args": ["--epochs", "1"]}})
    spec = sweeps.trial_spec(script, {"args.lr": 0.5, "args.fast": True}, "t")
    assert spec.script is not None
    assert spec.script.args == ["--epochs", "1", "--lr", "0.5", "--fast", "true"]
    with pytest.raises(ValidationError):
        sweeps.trial_spec(base, {"batch_size": 0}, "t")


def test_a_finished_trials_value_is_its_results_field_else_its_last_report() -> None:
    result = TrainResult(test_accuracy=0.97, train_loss=0.2)
    assert sweeps.final_value("test_accuracy", result, {10: 0.5}) == 0.97
    assert sweeps.final_value("loss", result, {10: 0.5, 20: 0.4}) == 0.4
    assert sweeps.final_value("accuracy", None, {}) is None


def test_the_best_trial_follows_the_direction() -> None:
    trials = [done(0, 0.5), done(1, 0.3), TrialRecord(2, TrialState.PRUNED, {}, value=0.1)]
    best = sweeps.best(create(), trials)
    assert best is not None and best.number == 1  # a pruned trial never counts
    best = sweeps.best(create(objective={"metric": "acc", "direction": "maximize"}), trials)
    assert best is not None and best.number == 0


def test_trials_start_up_to_the_concurrency_and_the_total() -> None:
    sweep = create(max_trials=5, max_concurrent=2)
    running = TrialRecord(0, TrialState.RUNNING, {})
    assert sweeps.to_start(sweep, []) == 2
    assert sweeps.to_start(sweep, [running]) == 1
    ended = [TrialRecord(i, TrialState.SUCCEEDED, {}) for i in range(4)]
    assert sweeps.to_start(sweep, ended) == 1
    assert sweeps.to_start(sweep, [*ended, running]) == 0


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"sampler": {"kind": "grid"}}, "a grid takes choices or int ranges"),
        (
            {
                "space": {"seed": {"type": "int", "low": 1, "high": 3}},
                "sampler": {"kind": "grid"},
                "max_trials": 4,
            },
            "max_trials 4 exceeds the grid's 3 points",
        ),
        ({"space": {"args.lr": LR["lr"]}}, "args.NAME is for a script job"),
        (
            {"spec": {"script": {"path": "t.py"}}, "space": {"params.x": LR["lr"]}},
            "a script job takes args.NAME",
        ),
        ({"space": {"lr": {"type": "int", "low": 1, "high": 2}}}, "lr: a float range"),
        ({"space": {"lr": {"type": "float", "low": 2, "high": 1}}}, "high 1 is below low 2"),
        ({"space": {"x": {"type": "categorical", "choices": [1, 1]}}}, "choices repeat"),
    ],
)
def test_a_sweep_that_cannot_run_is_refused(change: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        create(**change)
