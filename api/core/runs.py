"""A job's MLflow run (``DDPO_MLFLOW_TRACKING_URI``): made the first time
anything needs it (a node about to start the job's ranks, which then find
``MLFLOW_RUN_ID`` in their environment; the first report written on), once
per job whichever server or node asks first, and kept on the job's row.

Made outside any transaction (MLflow may be slow or away), then recorded
under the job's row lock: of two servers that made one at once, the second
finds the first's recorded and deletes its own."""

from __future__ import annotations

import json
import logging
from typing import Any, BinaryIO

from api.core import artifacts, lookup
from api.core.context import Core
from api.core.errors import DomainError
from ddpo.schemas import JobSpec, TrackingRun

log = logging.getLogger(__name__)


def for_part(core: Core, part_id: int, node_id: int) -> TrackingRun:
    """What a node gives its part's ranks: the tracking server and the job's run."""
    with core.db.read() as session:
        job_id = lookup.owned_part(session, part_id, node_id).job_id
    return TrackingRun(tracking_uri=core.settings.mlflow_tracking_uri, run_id=run_of(core, job_id))


def run_of(core: Core, job_id: int) -> str | None:
    """The job's run, made if it has none yet; None without MLflow or while
    MLflow cannot be reached (the job runs on untracked; said in the log)."""
    mlflow = core.tracking.mlflow
    if mlflow is None or not mlflow.available():
        return None
    with core.db.read() as session:
        job = lookup.job(session, job_id)
        if job.mlflow_run_id is not None:
            return job.mlflow_run_id
        spec, owner = job.spec, job.owner
    try:
        made = mlflow.create_run(job_id, spec.name or f"job-{job_id}", owner, params(spec))
    except Exception as exc:  # MLflow's client raises its own and requests' errors
        mlflow.failed(exc)
        log.warning("job %d: no MLflow run made; it runs untracked", job_id)
        return None
    with core.db.write() as session:
        job = lookup.job(session, job_id, for_update=True)
        kept = job.mlflow_run_id
        if kept is None:
            job.mlflow_run_id = made
            return made
    try:
        mlflow.delete_run(made)  # another server's was recorded first
    except Exception as exc:
        log.warning("job %d: MLflow run %s made twice, not deleted: %s", job_id, made, exc)
    return kept


def existing_run(core: Core, job_id: int) -> str | None:
    with core.db.read() as session:
        return lookup.job(session, job_id).mlflow_run_id


def final_model(core: Core, job_id: int) -> tuple[BinaryIO, int] | None:
    """The job's final model, opened, and its epoch (None if it has none)."""
    try:
        opened = artifacts.open_checkpoint(core, job_id)
    except DomainError:
        return None
    return opened.file, opened.epoch


def params(spec: JobSpec) -> dict[str, str]:
    """The spec as MLflow params: dotted names (``topology.num_machines``),
    values as text (lists and objects as JSON)."""
    flat: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        elif value is not None:
            text = value if isinstance(value, str) else json.dumps(value)
            flat[prefix] = text[:6000]  # MLflow's longest param value

    walk("", spec.model_dump(mode="json"))
    return flat
