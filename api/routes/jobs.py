"""What users do with jobs: submit, list, watch, cancel."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import FileResponse

from api import views
from api.deps import CoordinatorDep, DatabaseDep, JobId, NotifierDep, SettingsDep
from api.lifecycle import JobStatus
from api.schemas import JobPublic, JobSpec, JobsPublic, MetricsPublic

router = APIRouter(prefix="/jobs", tags=["jobs"])


@router.post("", status_code=201, response_model=JobPublic)
def submit_job(
    spec: JobSpec, coordinator: CoordinatorDep, db: DatabaseDep, notifier: NotifierDep
) -> JobPublic:
    job_id = coordinator.submit_job(spec)
    notifier.notify()
    return views.read_job(db=db, job_id=job_id)


@router.get("", response_model=JobsPublic)
def list_jobs(
    db: DatabaseDep,
    settings: SettingsDep,
    status: JobStatus | None = None,
    limit: Annotated[int, Query(ge=1)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> JobsPublic:
    """Newest first."""
    return views.read_jobs(
        db=db, status=status, limit=min(limit, settings.max_page_size), offset=offset
    )


@router.get("/{job_id}", response_model=JobPublic)
def get_job(job_id: JobId, db: DatabaseDep) -> JobPublic:
    return views.read_job(db=db, job_id=job_id)


@router.post("/{job_id}/cancel", response_model=JobPublic)
def cancel_job(
    job_id: JobId, coordinator: CoordinatorDep, db: DatabaseDep, notifier: NotifierDep
) -> JobPublic:
    """Queued jobs end ``cancelled`` at once; running ones go ``cancelling``
    until every node has stopped its ranks."""
    coordinator.cancel_job(job_id)
    notifier.notify()
    return views.read_job(db=db, job_id=job_id)


@router.get("/{job_id}/metrics", response_model=MetricsPublic)
def get_metrics(
    job_id: JobId,
    db: DatabaseDep,
    max_points: Annotated[int, Query(ge=2, le=10_000)] = 1000,
) -> MetricsPublic:
    """Rank 0's loss and throughput reports for the current attempt."""
    return views.read_metrics(db=db, job_id=job_id, max_points=max_points)


@router.get(
    "/{job_id}/model",
    response_class=FileResponse,
    responses={200: {"content": {"application/octet-stream": {}}}},
)
def download_model(job_id: JobId, coordinator: CoordinatorDep) -> FileResponse:
    """The newest checkpoint: ``torch.load(f)["model"]`` is the state_dict
    (after the last epoch of a succeeded job: the final model); it also holds
    the optimizer, epoch, step, spec and RNG state to resume from."""
    path, epoch = coordinator.checkpoint_path(job_id)
    return FileResponse(
        path, media_type="application/octet-stream", filename=f"job-{job_id}-epoch-{epoch}.pt"
    )
