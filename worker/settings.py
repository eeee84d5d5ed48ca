"""Worker settings: environment variables (prefix ``DDPO_WORKER_``), one place."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ddpo.schemas import NAME_PATTERN
from worker import cores


def _default_name() -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname()).strip("-.") or "node"
    return name[:64]


def _cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


# The default run directory, filled in with the node's name.
WORK_DIR_OF_ITS_NAME = Path("runs/<name>")


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="DDPO_WORKER_", extra="ignore", populate_by_name=True
    )

    server_url: str = Field(
        "http://127.0.0.1:8000",
        validation_alias=AliasChoices("DDPO_SERVER_URL", "server_url"),
        description="The ddpo server",
    )
    # Under Slurm (srun sets SLURMD_NODENAME, SLURM_CPUS_ON_NODE and, with
    # GPUs allocated, SLURM_GPUS_ON_NODE) a worker is named and sized by its
    # allocation with no flags: deploy/slurm/ddpo-workers.sbatch relies on it.
    # Ours come first, so a site can still say otherwise.
    name: str = Field(
        default_factory=_default_name,
        pattern=NAME_PATTERN,
        validation_alias=AliasChoices("DDPO_WORKER_NAME", "SLURMD_NODENAME", "name"),
        description="The node's name, unique on the server; default: Slurm's node name "
        "in a Slurm job, else the host name",
    )
    address: str | None = Field(
        None,
        description="Address other nodes reach this one at (MASTER_ADDR); None: the "
        "local address of this host's route to the server",
    )
    interface: str | None = Field(
        None,
        description="Network interface the ranks' collectives use (gloo, NCCL); None: "
        "the one holding the address",
    )
    cpus: int | None = Field(
        None,
        ge=1,
        le=4096,
        validation_alias=AliasChoices("DDPO_WORKER_CPUS", "SLURM_CPUS_ON_NODE", "cpus"),
        description="Cores this node's ranks share; None: the affinity mask and the "
        "cgroup CPU quota (in a Slurm job: the CPUs it was allocated on this node)",
    )
    cpu_set: str | None = Field(
        None,
        max_length=4096,
        description="The CPUs this worker and its ranks run on (a CPU list: 0-3,6), "
        "e.g. its share of a host other workers share; None: those it was started with",
    )
    slots: int = Field(1, ge=1, le=64, description="Job parts run at once")
    gpus: int | None = Field(
        None,
        ge=0,
        validation_alias=AliasChoices("DDPO_WORKER_GPUS", "SLURM_GPUS_ON_NODE", "gpus"),
        description="GPUs offered; None: count them (in a Slurm job: those it was allocated "
        "on this node)",
    )
    data_dir: Path = Field(
        Path("./data"),
        validation_alias=AliasChoices("DDPO_DATA_DIR", "data_dir"),
        description="Where datasets live (MNIST under <data_dir>/MNIST/raw)",
    )
    work_dir: Path = Field(
        WORK_DIR_OF_ITS_NAME,
        description="Per-part run directories, logs and the node's credential; by default "
        "one per node name, so several workers started in one directory keep apart",
    )
    trainers: dict[str, str] = Field(
        default_factory=dict,
        description="Extra trainers, name -> 'module:attribute' (built in: mnist)",
    )
    script_dir: Path | None = Field(
        None,
        validation_alias=AliasChoices("DDPO_WORKER_SCRIPT_DIR", "DDPO_SCRIPT_DIR", "script_dir"),
        description="A directory of torchrun-style scripts jobs may run (by their path in "
        "it); None: no scripts",
    )
    poll_wait_s: float = Field(2.0, ge=0, le=30, description="Long-poll wait when idle")
    report_interval_s: float = Field(
        1.0, gt=0, description="How often progress is shipped while a part runs"
    )
    stop_grace_s: float = Field(5.0, ge=0, description="SIGTERM to SIGKILL when stopping ranks")
    leave_grace_s: float = Field(
        20.0,
        ge=0,
        le=3600,
        description="On SIGTERM (a Slurm walltime, a spot notice, systemctl stop) with parts "
        "running: how long their jobs get to stop at a step and checkpoint, to start again "
        "elsewhere, before the worker stops them and exits (keep it and DDPO_STOP_GRACE_S "
        "under what your scheduler waits before SIGKILL: Slurm's KillWait is 30 s, "
        "systemd's TimeoutStopSec 90 s); 0: stop them at once. A second SIGTERM cuts it short",
    )
    process_group_timeout_s: float = Field(
        300.0, gt=0, description="torch.distributed timeout for rendezvous and collectives"
    )
    request_timeout_s: float = Field(30.0, gt=0)
    join_token: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("DDPO_JOIN_TOKEN", "join_token"),
        description="The server's DDPO_JOIN_TOKEN: lets this machine join as a new node",
    )
    credential_file: Path | None = Field(
        None,
        description="Where the node's own credential is kept between runs (default "
        "<work_dir>.node-credential, beside the work directory: outside the tree the ranks "
        "run in)",
    )
    rank_env: str = Field(
        "",
        description="Environment variables the ranks get besides the allow-list "
        "(worker/rank_env.py: PATH, PYTHONPATH, CUDA_*, NCCL_*, OMP_* and the like): names "
        "or NAME* prefixes, comma-separated. No DDPO_ variable ever reaches a rank",
    )
    prewarm: bool = Field(
        True,
        description="Fork launchers from a process that imported torch once (saves seconds a job)",
    )
    extensions_dir: Path = Field(
        default_factory=lambda: _cache_home() / "ddpo" / "extensions",
        description="Where the node keeps the kernels it compiles for the built-in trainer "
        "(performance.fused_pool; default $XDG_CACHE_HOME/ddpo/extensions, shared by the "
        "machine's workers)",
    )
    build_extensions: bool = Field(
        True,
        description="Compile those kernels in the background, at idle priority, when they "
        "are missing (a C++ compiler and about 20 s of one core, once per machine); false: "
        "ranks use the ones already there, or aten's ops",
    )

    @field_validator("trainers")
    @classmethod
    def _check_trainers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, target in value.items():
            if not re.match(NAME_PATTERN, name):
                raise ValueError(f"trainer name {name!r} must match {NAME_PATTERN}")
            if ":" not in target:
                raise ValueError(f"trainer {name!r}: {target!r} is not 'module:attribute'")
        return value

    @field_validator("cpu_set")
    @classmethod
    def _a_cpu_list(cls, value: str | None) -> str | None:
        if value is not None:
            cores.parse_cpu_set(value)  # its ValueError names what is wrong
        return value

    @property
    def cpus_pinned(self) -> frozenset[int] | None:
        return cores.parse_cpu_set(self.cpu_set) if self.cpu_set is not None else None

    @model_validator(mode="after")
    def _work_dir_of_its_name(self) -> WorkerSettings:
        if self.work_dir == WORK_DIR_OF_ITS_NAME:
            self.work_dir = Path("runs") / self.name
        return self

    @property
    def rank_env_names(self) -> list[str]:
        return [name.strip() for name in self.rank_env.split(",") if name.strip()]

    @property
    def credential_path(self) -> Path:
        default = self.work_dir.parent / f"{self.work_dir.name}.node-credential"
        return self.credential_file or default

    @property
    def legacy_credential_path(self) -> Path:
        """Where it was kept before (inside the work directory), moved on start."""
        return self.work_dir / "node-credential"
