"""What a user asks for (a job, a study) and what a job ends with (its
result or its error): the values the database stores as JSON."""

from __future__ import annotations

import json
import posixpath
import re
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from ddpo.failures import FailureReason
from ddpo.schemas.strict import MAX_WORLD_SIZE, NAME_PATTERN, Strict, check_json_data, read_back


def _machines_schema(schema: dict[str, Any]) -> None:
    """num_machines takes a number or, for an elastic job, a range."""
    number = {k: schema.pop(k) for k in ("type", "minimum", "maximum", "default") if k in schema}
    schema["anyOf"] = [
        {k: v for k, v in number.items() if k != "default"},
        {
            "type": "object",
            "properties": {
                "min": {"type": "integer", "minimum": 1, "maximum": MAX_MACHINES},
                "max": {"type": "integer", "minimum": 1, "maximum": MAX_MACHINES},
            },
            "required": ["min", "max"],
            "additionalProperties": False,
        },
    ]
    schema["default"] = number.get("default", 1)


MAX_MACHINES = 64


class Topology(Strict):
    num_machines: int = Field(
        1,
        ge=1,
        le=MAX_MACHINES,
        description='Machines (nodes) the job spans; a range ({"min": 2, "max": 4}) makes '
        "the job elastic: it starts once `min` nodes are free, takes up to `max`, shrinks "
        "past a lost node and grows onto free ones (stored as num_machines = min and "
        "max_machines = max)",
        json_schema_extra=_machines_schema,
    )
    max_machines: int | None = Field(
        None,
        ge=1,
        le=MAX_MACHINES,
        # A job of one size reads as it always did.
        exclude_if=lambda value: value is None,
        description="Elastic: at most this many machines, num_machines the fewest; each "
        "attempt runs on as many as are free (GET /jobs/{id} gives each attempt's world size)",
    )
    num_processes: int = Field(1, ge=1, le=64, description="Training processes per machine")

    @model_validator(mode="before")
    @classmethod
    def _a_range_of_machines(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("num_machines"), dict):
            return data
        if data.get("max_machines") is not None:
            raise ValueError("num_machines is a range: leave max_machines out")
        given = data["num_machines"]
        extra = sorted(set(given) - {"min", "max"})
        if extra:
            raise ValueError(f"num_machines: a range has min and max, not {', '.join(extra)}")
        bounds = []
        for end in ("min", "max"):
            value = given.get(end)
            if type(value) is not int or not 1 <= value <= MAX_MACHINES:
                raise ValueError(f"num_machines.{end}: an integer from 1 to {MAX_MACHINES}")
            bounds.append(value)
        return {**data, "num_machines": bounds[0], "max_machines": bounds[1]}

    @property
    def elastic(self) -> bool:
        return self.max_machines is not None

    @property
    def most_machines(self) -> int:
        return self.num_machines if self.max_machines is None else self.max_machines

    @property
    def world_size(self) -> int:
        return self.num_machines * self.num_processes

    def sized(self, machines: int) -> Topology:
        """This topology on ``machines`` machines (an elastic job's attempt)."""
        return self.model_copy(update={"num_machines": machines})

    @model_validator(mode="after")
    def _world_size_within_limit(self) -> Topology:
        if self.max_machines is not None and self.max_machines < self.num_machines:
            raise ValueError(
                f"num_machines: max {self.max_machines} is below min {self.num_machines}"
            )
        world = self.most_machines * self.num_processes
        if world > MAX_WORLD_SIZE:
            raise ValueError(
                f"world size {world} (num_machines x num_processes) "
                f"exceeds the limit of {MAX_WORLD_SIZE}"
            )
        return self


class Performance(Strict):
    """How the training runs, not what it computes: every option keeps the
    recipe's maths (see BENCHMARKS.md for what each one buys here)."""

    data_pipeline: Literal["tensor", "torchvision"] = Field(
        "tensor",
        description="tensor: MNIST normalised once, batches gathered by index in the "
        "DistributedSampler's order; torchvision: the recipe's per-image "
        "ToTensor/Normalize DataLoader (the same samples, bit for bit)",
    )
    threads_per_process: int | None = Field(
        None, ge=1, le=256, description="Intra-op threads; none: the node's cores // processes"
    )
    channels_last: bool = Field(True, description="NHWC activations (fast max-pool on CPU)")
    pool_before_relu: bool = Field(
        True,
        description="max-pool then ReLU: the same values and gradients as ReLU then "
        "max-pool, on 4x fewer elements",
    )
    fused_pool: bool = Field(
        True,
        description="The max-pool and the ReLU after it as one AVX-512 (or AVX2) kernel the worker "
        "compiles once per machine (worker/fused_pool.py), with the first dropout and fc1's "
        "NCHW layout in the same pass: the same values and gradients, without aten's "
        "zero-filled input gradient and int64 indices or the layout copies. Where it is not "
        "built yet, on CPUs without AVX2 and on GPUs: aten's ops",
    )
    inplace_relu: bool = Field(
        True,
        description="The first convolution's ReLU written over its output (which nothing "
        "else keeps): the same values, one large tensor fewer a step",
    )
    dropout_masks: Literal["pcg64", "uniform", "bernoulli"] = Field(
        "pcg64",
        description="pcg64: keep where a 32-bit word from NumPy's PCG64 (seeded from torch's "
        "generator) is >= p * 2**32; uniform: keep where U[0,1) >= p; both the same "
        "Bernoulli(1-p) masks as bernoulli (torch's F.dropout), drawn faster (pcg64 on the "
        "CPU; on a GPU it draws as uniform)",
    )
    keep_freed_memory: bool = Field(
        True,
        description="glibc malloc keeps freed memory for the next step instead of returning "
        "it to the kernel (no page faults on each step's large tensors)",
    )
    start_method: Literal["fork", "spawn"] = Field(
        "fork", description="How the launcher starts ranks; fork skips a second torch import"
    )
    same_host_allreduce: Literal["shared_memory", "gloo"] = Field(
        "shared_memory",
        description="How ranks of a one-machine gloo job average gradients: through shared "
        "memory (the same average, without TCP) or gloo's TCP all-reduce",
    )
    ddp_with_one_rank: bool = Field(
        False,
        description="Wrap a job of one rank in DistributedDataParallel as the recipe does; "
        "false: train the module itself (DDP's average over one rank is each gradient as "
        "it is: the same maths, without its bucket copies)",
    )
    flat_optimizer: bool = Field(
        True,
        description="Parameters, gradients and Adadelta's state each in one flat buffer: the "
        "optimizer's step is its eleven operations once rather than once per parameter "
        "(the same weights, bit for bit)",
    )
    gradient_as_bucket_view: bool = Field(
        False, description="DDP option (no measurable gain here, see BENCHMARKS.md)"
    )
    bucket_cap_mb: float = Field(25.0, gt=0, le=1024, description="DDP all-reduce bucket size")
    precision: Literal["fp32", "bf16-mixed", "fp16-mixed"] = Field(
        "fp32",
        description="fp32: the recipe's maths; bf16-mixed: the forward pass and loss under "
        "torch.autocast in bfloat16, weights and optimizer in fp32 (CPU or GPU); "
        "fp16-mixed: autocast in float16 with a gradient scaler (GPU: backend nccl). "
        "Plugins get it as ctx.autocast() and ctx.grad_scaler(), scripts as "
        "ddpo.autocast(device) and DDPO_PRECISION",
    )


# A script's path: relative, inside the worker's script directory, made of
# plain names (no "..", no leading "/", no backslashes or control characters).
SCRIPT_PATH_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*\.py$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"
# A trainer's parameters travel as JSON and are stored with the job.
MAX_PARAMS_BYTES = 16 * 1024
# The trainer name of a job that runs a script.
SCRIPT_TRAINER = "script"


class ScriptRef(Strict):
    """A torchrun-style script in the workers' script directory, run as it is
    in a fresh interpreter per process."""

    path: str = Field(
        max_length=255,
        description="Relative to the worker's --script-dir, e.g. 'train.py' or 'nlp/lm.py'",
    )
    args: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Its command-line arguments, as torchrun passes them after the script",
    )
    sha256: str | None = Field(
        None,
        pattern=SHA256_PATTERN,
        description="The content hash to run (GET /trainers lists what nodes have); the "
        "server fills it in at submit when the live nodes that have the path agree",
    )

    @field_validator("path")
    @classmethod
    def _inside_the_directory(cls, value: str) -> str:
        if posixpath.isabs(value) or ".." in value.split("/"):
            raise ValueError("must be a path inside the script directory (no '/' first, no '..')")
        if not re.fullmatch(SCRIPT_PATH_PATTERN, value):
            raise ValueError(
                "must be a relative .py path of letters, digits, '_', '.' and '-' "
                "(directories separated by '/')"
            )
        return value

    @field_validator("args")
    @classmethod
    def _args_bounded(cls, value: list[str]) -> list[str]:
        for index, arg in enumerate(value):
            if len(arg) > 4096:
                raise ValueError(f"argument {index} is longer than 4096 characters")
        return value


# Priorities run from -PRIORITY_LIMIT to PRIORITY_LIMIT (0 unless said).
PRIORITY_LIMIT = 1000
# The longest a job may ask to be given to stop (Determined's default was an hour).
MAX_STOP_GRACE_S = 3600.0


class JobUpdate(Strict):
    """What may change in a queued job."""

    priority: int = Field(ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT, description="Higher first")


class JobSpec(Strict):
    """What a user asks for. Immutable once submitted."""

    name: str | None = Field(
        None,
        max_length=128,
        description="Free-form label",
    )
    trainer: str = Field(
        "mnist",
        pattern=NAME_PATTERN,
        description="A trainer installed on the workers (built in: mnist)",
    )
    trainer_version: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="Run only on nodes offering this version of the trainer, its params "
        "checked against that version's schema alone (GET /trainers lists them); none: any "
        "version, the params valid for every schema the live nodes declare",
    )
    script: ScriptRef | None = Field(
        None,
        validate_default=True,
        description="Run this torchrun-style script instead of a trainer (then leave "
        "`trainer` and `params` out)",
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="The trainer's own parameters, checked at submit against the schema "
        "its nodes report (GET /trainers); the fields below are every trainer's",
    )
    topology: Topology = Field(default_factory=Topology)
    backend: Literal["gloo", "nccl"] = Field(
        "gloo", description="gloo on CPU; nccl needs a GPU per process on every node"
    )
    batch_size: int = Field(128, ge=1, le=65536, description="Per process")
    epochs: int = Field(1, ge=1, le=1000)
    lr: float = Field(0.5, gt=0, le=1000, allow_inf_nan=False)
    seed: int = Field(
        0,
        ge=0,
        le=2**32 - 1,
        description="Model init and shuffling (0: DistributedSampler's own default)",
    )
    max_steps_per_epoch: int | None = Field(
        None, ge=1, le=10_000_000, description="Cut each epoch short (smoke runs)"
    )
    checkpoint_every_steps: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description="Also checkpoint every this many steps within an epoch (the built-in "
        "trainer; rank 0 uploads each): a lost node or a killed rank then costs at most "
        "this many steps, not the rest of an epoch; none: at the end of each epoch and "
        "when asked to stop",
    )
    performance: Performance = Field(default_factory=Performance)
    max_restarts: int = Field(
        0,
        ge=0,
        le=100,
        description="New attempts after a retryable failure (a lost node, a rank killed by a "
        "signal, rendezvous trouble), each resuming from the last whole checkpoint; failures "
        "of the training code itself are never retried (like torchrun's --max-restarts)",
    )
    priority: int = Field(
        0,
        ge=-PRIORITY_LIMIT,
        le=PRIORITY_LIMIT,
        description="Queued jobs of a higher priority are tried first; first in, first out "
        "within a priority. Changeable while queued (PATCH /jobs/{id})",
    )
    preemptible: bool = Field(
        True,
        description="A queued job of a higher priority may stop it (at a step, with a "
        "checkpoint: it goes back to the queue at its place and resumes from that step, "
        "no restart used); false: it runs to its end once started",
    )
    stop_grace_s: float | None = Field(
        None,
        ge=0,
        le=MAX_STOP_GRACE_S,
        allow_inf_nan=False,
        description="When asked to stop (preempted, drained), how long its ranks have to "
        "reach a step and checkpoint before SIGTERM (then SIGKILL after the worker's grace); "
        "none: the server's DDPO_STOP_GRACE_S",
    )
    max_run_seconds: float | None = Field(
        None,
        gt=0,
        le=366 * 24 * 3600,
        allow_inf_nan=False,
        description="Fail the job with reason `deadline`, without retry, once this long has "
        "passed since its first start",
    )

    @model_validator(mode="before")
    @classmethod
    def _a_script_job_names_no_trainer(cls, data: Any) -> Any:
        # A script job's trainer reads "script", so every job names what it runs.
        if isinstance(data, dict) and data.get("script") is not None and "trainer" not in data:
            return {**data, "trainer": SCRIPT_TRAINER}
        return data

    @field_validator("script")
    @classmethod
    def _a_script_or_a_trainer(cls, value: ScriptRef | None, info: ValidationInfo) -> Any:
        trainer = info.data.get("trainer")
        if value is not None and trainer not in (None, SCRIPT_TRAINER):
            raise ValueError("a job runs a script or a trainer: leave `trainer` out")
        if value is not None and info.data.get("trainer_version") is not None:
            raise ValueError("a script has no trainer version: leave `trainer_version` out")
        if value is None and trainer == SCRIPT_TRAINER:
            raise ValueError(f"trainer '{SCRIPT_TRAINER}' needs a `script` to run")
        return value

    @field_validator("performance")
    @classmethod
    def _a_precision_the_backend_runs(cls, value: Performance, info: ValidationInfo) -> Any:
        if value.precision == "fp16-mixed" and info.data.get("backend") != "nccl":
            raise ValueError(
                "precision: fp16-mixed runs on GPUs (backend nccl); on CPUs use bf16-mixed"
            )
        return value

    @field_validator("params")
    @classmethod
    def _params_bounded(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if value and info.data.get("script") is not None:
            raise ValueError("a script takes its arguments in script.args: leave `params` out")
        if not read_back(info):
            check_json_data(value)
        try:
            size = len(json.dumps(value, allow_nan=False))
        except ValueError:
            raise ValueError("must be JSON (no NaN or infinite numbers)") from None
        if size > MAX_PARAMS_BYTES:
            raise ValueError(f"is {size} bytes of JSON; at most {MAX_PARAMS_BYTES}")
        return value

    @property
    def needs(self) -> str:
        """What a node must have to run it, in words."""
        if self.script is not None:
            return f"script '{self.script.path}'"
        if self.trainer_version is not None:
            return f"trainer '{self.trainer}' version '{self.trainer_version}'"
        return f"trainer '{self.trainer}'"


class TrainResult(Strict):
    """What rank 0 measured once training ended."""

    train_loss: float | None = Field(None, description="Mean loss of rank 0's last epoch")
    test_loss: float | None = None
    test_accuracy: float | None = Field(None, ge=0, le=1)
    setup_seconds: float | None = Field(None, ge=0)
    train_seconds: float | None = Field(None, ge=0)
    eval_seconds: float | None = Field(None, ge=0)
    epoch_seconds: list[float] = Field(default_factory=list)
    samples_per_sec: float | None = Field(None, ge=0)
    threads_per_process: int | None = Field(None, ge=1)
    precision: str | None = Field(
        None, description="performance.precision the trainer ran in (none: a script's job)"
    )


class JobError(BaseModel):
    reason: FailureReason
    message: str
    machine_id: int | None = None
    rank: int | None = None
    node: str | None = None
    exit_code: int | None = None
    traceback_tail: str | None = None


class StudyRow(Strict):
    """One topology of a study; the batch size is per process."""

    num_machines: int = Field(1, ge=1, le=64)
    num_processes: int = Field(ge=1, le=64)
    batch_size: int = Field(ge=1, le=65536)

    @model_validator(mode="after")
    def _world_size_within_limit(self) -> StudyRow:
        Topology(num_machines=self.num_machines, num_processes=self.num_processes)
        return self


def _default_rows() -> list[StudyRow]:
    # The recipe's table: the global batch stays 128.
    return [StudyRow(num_processes=p, batch_size=128 // p) for p in (1, 2, 4, 8)]


class StudyCreate(Strict):
    # Its jobs are named after it plus their row (": 64 x 64, batch 65536"),
    # within a job name's 128 characters.
    name: str | None = Field(None, max_length=96)
    spec: JobSpec = Field(
        default_factory=JobSpec,
        description="The training to repeat; each row replaces its topology and batch size",
    )
    rows: list[StudyRow] = Field(default_factory=_default_rows, min_length=1, max_length=32)
