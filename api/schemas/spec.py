"""What a user asks for (a job, a study) and what a job ends with (its
result or its error): the values the database stores as JSON."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from api.failures import FailureReason
from api.schemas.strict import MAX_WORLD_SIZE, NAME_PATTERN, Strict


class Topology(Strict):
    num_machines: int = Field(1, ge=1, le=64, description="Machines (nodes) the job spans")
    num_processes: int = Field(1, ge=1, le=64, description="Training processes per machine")

    @property
    def world_size(self) -> int:
        return self.num_machines * self.num_processes

    @model_validator(mode="after")
    def _world_size_within_limit(self) -> Topology:
        if self.world_size > MAX_WORLD_SIZE:
            raise ValueError(
                f"world size {self.world_size} (num_machines x num_processes) "
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
    dropout_masks: Literal["uniform", "bernoulli"] = Field(
        "uniform",
        description="uniform: keep where U[0,1) >= p (the same Bernoulli(1-p) masks, "
        "drawn faster than torch's bernoulli_)",
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
    gradient_as_bucket_view: bool = Field(
        False, description="DDP option (no measurable gain here, see BENCHMARKS.md)"
    )
    bucket_cap_mb: float = Field(25.0, gt=0, le=1024, description="DDP all-reduce bucket size")


class JobSpec(Strict):
    """What a user asks for. Immutable once submitted."""

    name: str | None = Field(None, max_length=128, description="Free-form label")
    trainer: str = Field(
        "mnist",
        pattern=NAME_PATTERN,
        description="A trainer installed on the workers (built in: mnist)",
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
    performance: Performance = Field(default_factory=Performance)
    max_restarts: int = Field(
        0,
        ge=0,
        le=100,
        description="New attempts after a retryable failure (a lost node, a rank killed by a "
        "signal, rendezvous trouble), each resuming from the last whole checkpoint; failures "
        "of the training code itself are never retried (like torchrun's --max-restarts)",
    )
    max_run_seconds: float | None = Field(
        None,
        gt=0,
        le=366 * 24 * 3600,
        allow_inf_nan=False,
        description="Fail the job with reason `deadline`, without retry, once this long has "
        "passed since its first start",
    )


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
