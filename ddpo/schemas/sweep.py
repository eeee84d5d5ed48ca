"""A sweep: one job spec over many hyperparameters, each trial an ordinary
job, the poor ones stopped early. What a user sends (SweepCreate) and reads
(SweepPublic); the search itself is Optuna's (api/sweeps.py)."""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag, field_validator, model_validator

from ddpo.lifecycle import JobStatus, Named
from ddpo.schemas.spec import SCRIPT_TRAINER, JobSpec
from ddpo.schemas.strict import Strict

MAX_TRIALS = 1000
MAX_CONCURRENT = 64
MAX_DIMENSIONS = 32
MAX_CHOICES = 100

# The spec's own fields a sweep may vary; a trainer's params go as
# "params.NAME", a script's arguments as "args.NAME" (--NAME VALUE).
SPEC_FIELDS = ("lr", "batch_size", "seed")
PARAM_PREFIX = "params."
ARG_PREFIX = "args."
_NAME = r"[A-Za-z_][A-Za-z0-9_-]{0,63}"
DIMENSION_PATTERN = rf"^(lr|batch_size|seed|params\.{_NAME}|args\.{_NAME})$"
METRIC_PATTERN = r"^[A-Za-z_][A-Za-z0-9_./-]{0,63}$"  # as a report names it

Number = Annotated[float, Field(allow_inf_nan=False, ge=-1e15, le=1e15)]


class FloatRange(Strict):
    type: Literal["float"]
    low: Number
    high: Number
    log: bool = Field(False, description="Sample on a log scale (low must be > 0)")
    step: Number | None = Field(None, gt=0, description="Only multiples of this from low")

    @model_validator(mode="after")
    def _a_range(self) -> FloatRange:
        if self.high < self.low:
            raise ValueError(f"high {self.high:g} is below low {self.low:g}")
        if self.log and self.low <= 0:
            raise ValueError("a log scale needs low > 0")
        if self.log and self.step is not None:
            raise ValueError("a log scale takes no step")
        return self


class IntRange(Strict):
    type: Literal["int"]
    low: int = Field(ge=-(2**53), le=2**53)
    high: int = Field(ge=-(2**53), le=2**53)
    log: bool = False
    step: int = Field(1, ge=1, le=2**53)

    @model_validator(mode="after")
    def _a_range(self) -> IntRange:
        if self.high < self.low:
            raise ValueError(f"high {self.high} is below low {self.low}")
        if self.log and self.low <= 0:
            raise ValueError("a log scale needs low > 0")
        if self.log and self.step != 1:
            raise ValueError("a log scale takes no step")
        return self


Choice = str | bool | int | float


class Choices(Strict):
    type: Literal["categorical"]
    choices: list[Choice] = Field(min_length=1, max_length=MAX_CHOICES)

    @field_validator("choices")
    @classmethod
    def _plain(cls, value: list[Choice]) -> list[Choice]:
        for choice in value:
            if isinstance(choice, float) and not math.isfinite(choice):
                raise ValueError("choices are finite numbers, strings or booleans")
            if isinstance(choice, str) and len(choice) > 256:
                raise ValueError("a choice is at most 256 characters")
        if len({repr(c) for c in value}) != len(value):
            raise ValueError("choices repeat")
        return value


def _kind(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in ("float", "int", "categorical") else None


# Told apart by "type" (a callable discriminator: Strict's checks of JSON
# types run on every field, which pydantic's own tag inference refuses).
Dimension = Annotated[
    Annotated[FloatRange, Tag("float")]
    | Annotated[IntRange, Tag("int")]
    | Annotated[Choices, Tag("categorical")],
    Discriminator(
        _kind,
        custom_error_type="dimension_type",
        custom_error_message="type: one of 'float', 'int', 'categorical'",
    ),
]


class Objective(Strict):
    metric: str = Field(
        "loss",
        pattern=METRIC_PATTERN,
        description="What a trial is judged by: `loss` (each progress report's), a name the "
        "trainer reports among its metrics (`ddpo.report(..., accuracy=...)`), or a field "
        "of its result (test_accuracy, test_loss, train_loss). Its reports while training "
        "are what the early stopper compares; its final value is the result's field when "
        "the result has one, else the last report",
    )
    direction: Literal["minimize", "maximize"] = "minimize"


class Sampler(Strict):
    kind: Literal["tpe", "random", "grid"] = Field(
        "tpe",
        description="Optuna's TPESampler, RandomSampler or GridSampler (grid: every "
        "dimension categorical or an int range; max_trials at most the grid's size)",
    )
    seed: int = Field(0, ge=0, le=2**32 - 1, description="The same seed, the same trials")


class Pruner(Strict):
    kind: Literal["none", "median", "asha"] = Field(
        "none",
        description="asha: Optuna's SuccessiveHalvingPruner (asynchronous successive "
        "halving); median: its MedianPruner; none: every trial runs to its end",
    )
    reduction_factor: int = Field(3, ge=2, le=16, description="asha: keep 1 in this many")
    grace_steps: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description="asha: the steps every trial trains before its first judgement (the "
        "first rung); none: estimated from the first finished trial",
    )
    startup_trials: int = Field(
        3, ge=0, le=MAX_TRIALS, description="median: trials that finish before any is stopped"
    )
    warmup_steps: int = Field(
        0, ge=0, le=10_000_000, description="median: steps a trial trains before it may stop"
    )


class SweepCreate(Strict):
    name: str | None = Field(None, max_length=128)
    spec: JobSpec = Field(
        description="The base job: every trial is this spec with the space's values in it"
    )
    space: dict[str, Dimension] = Field(
        min_length=1,
        max_length=MAX_DIMENSIONS,
        description="What to vary: lr, batch_size, seed, params.NAME (a trainer's "
        "parameter, checked against its schema) or args.NAME (a script's --NAME VALUE)",
    )
    objective: Objective = Field(default_factory=Objective)
    max_trials: int = Field(10, ge=1, le=MAX_TRIALS)
    max_concurrent: int = Field(1, ge=1, le=MAX_CONCURRENT, description="Trials queued at once")
    sampler: Sampler = Field(default_factory=Sampler)
    pruner: Pruner = Field(default_factory=Pruner)

    @field_validator("space")
    @classmethod
    def _known_dimensions(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name, dimension in value.items():
            if not re.fullmatch(DIMENSION_PATTERN, name):
                raise ValueError(
                    f"{name}: a sweep varies lr, batch_size, seed, params.NAME or args.NAME"
                )
            if name == "lr" and isinstance(dimension, IntRange):
                raise ValueError("lr: a float range or choices")
            if name in ("batch_size", "seed") and isinstance(dimension, FloatRange):
                raise ValueError(f"{name}: an int range or choices")
        return value

    @model_validator(mode="after")
    def _fits_the_spec(self) -> SweepCreate:
        script = self.spec.trainer == SCRIPT_TRAINER
        for name in self.space:
            if name.startswith(PARAM_PREFIX) and script:
                raise ValueError(f"space.{name}: a script job takes args.NAME, not params")
            if name.startswith(ARG_PREFIX) and not script:
                raise ValueError(f"space.{name}: args.NAME is for a script job's arguments")
        if self.sampler.kind == "grid":
            size = 1
            for name, dimension in self.space.items():
                if isinstance(dimension, FloatRange):
                    raise ValueError(
                        f"space.{name}: a grid takes choices or int ranges, not a float range"
                    )
                size *= grid_values_count(dimension)
            if self.max_trials > size:
                raise ValueError(f"max_trials {self.max_trials} exceeds the grid's {size} points")
        return self


def grid_values_count(dimension: IntRange | Choices) -> int:
    if isinstance(dimension, Choices):
        return len(dimension.choices)
    return (dimension.high - dimension.low) // dimension.step + 1


class TrialState(Named):
    """A trial's state in its sweep (its job's status says the rest)."""

    QUEUED = "queued"
    RUNNING = "running"
    PRUNED = "pruned"  # stopped early, at a step, by the sweep's early stopper
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def is_terminal(self) -> bool:
        return self not in (TrialState.QUEUED, TrialState.RUNNING)


class TrialPublic(BaseModel):
    number: int = Field(description="0, 1, 2, ... in the order they were asked")
    job_id: int
    state: TrialState
    job_status: JobStatus
    params: dict[str, Choice] = Field(description="Its values of the space's dimensions")
    value: float | None = Field(
        None, description="The objective: final once it succeeded, else the latest report"
    )
    step: int | None = Field(None, description="The step of the latest report")
    pruned_at_step: int | None = None
    values: list[tuple[int, float | None]] = Field(
        default_factory=list,
        description="The objective's reports: (step, value); GET /sweeps/{id} only",
    )
    test_accuracy: float | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


class BestTrial(BaseModel):
    number: int
    job_id: int
    value: float
    params: dict[str, Choice]


class SweepPublic(BaseModel):
    id: int
    name: str | None
    owner: str | None
    status: JobStatus = Field(
        description="running until every trial has ended and no more will start; then "
        "succeeded if any trial did, cancelled if cancelled, else failed"
    )
    created_at: datetime
    finished_at: datetime | None = None
    error: str | None = Field(None, description="Why it ended early, if it could not go on")
    spec: JobSpec
    space: dict[str, Dimension]
    objective: Objective
    sampler: Sampler
    pruner: Pruner
    max_trials: int
    max_concurrent: int
    counts: dict[TrialState, int] = Field(description="Trials in each state")
    best: BestTrial | None = Field(None, description="The best succeeded trial so far")
    trials: list[TrialPublic]
    slot_seconds: float = Field(
        description="Machines x running seconds summed over the trials: what the sweep cost"
    )


class SweepsPublic(BaseModel):
    data: list[SweepPublic]
