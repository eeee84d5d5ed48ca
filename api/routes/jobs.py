"""What users do with jobs: submit, list, watch, cancel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from api import route_table, views
from api.core import artifacts
from api.core import jobs as jobs_core
from api.core import nodes as nodes_core
from api.deps import (
    ActorDep,
    CallerNodeDep,
    CoreDep,
    DatabaseDep,
    JobId,
    ReadCacheDep,
    SettingsDep,
)
from api.read_cache import ReadCache, cached_json
from api.routes import endpoint
from db.models import Attempt, Job, LogRow, Node, Part, ProgressRow
from ddpo.lifecycle import JobStatus
from ddpo.schemas import (
    CHECKPOINT_SHA256_HEADER,
    DB_INT_MAX,
    JobPublic,
    JobSpec,
    JobsPublic,
    JobUpdate,
    LogsPublic,
    MetricsPublic,
    documented,
)

router = APIRouter(prefix="/jobs", tags=["jobs"], responses=documented(400, 403, 404, 409))

# How often a followed log checks for new lines.
FOLLOW_POLL_S = 0.5


@endpoint(
    router,
    route_table.SUBMIT_JOB,
    status_code=201,
    response_model=JobPublic,
    responses={
        200: {"model": JobPublic, "description": "The job this Idempotency-Key made"},
        **documented(429),
    },
)
def submit_job(
    spec: JobSpec,
    core: CoreDep,
    db: DatabaseDep,
    actor: ActorDep,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            min_length=1,
            max_length=200,
            description="Send the same key again (a retry after a timeout) and get the same "
            "job back, never a second one",
        ),
    ] = None,
) -> JobPublic:
    """Queue a job; it is the caller's (``owner``: the key's name)."""
    job_id, created = jobs_core.submit_job(core, spec, actor, idempotency_key)
    if not created:
        response.status_code = 200
    return views.read_job(db=db, job_id=job_id)


@endpoint(router, route_table.LIST_JOBS, response_model=JobsPublic)
def list_jobs(
    db: DatabaseDep,
    settings: SettingsDep,
    status: JobStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=DB_INT_MAX)] = 50,
    offset: Annotated[int, Query(ge=0, le=DB_INT_MAX)] = 0,
) -> JobsPublic:
    """Newest first."""
    return views.read_jobs(
        db=db, status=status, limit=min(limit, settings.max_page_size), offset=offset
    )


@endpoint(router, route_table.GET_JOB, response_model=JobPublic)
async def get_job(
    job_id: JobId, request: Request, db: DatabaseDep, cache: ReadCacheDep
) -> Response:
    """One job: its status, progress, timing, attempts, result or error."""
    # What dashboards poll, about once a second each, so it is lean: the
    # same answer is shared until the next write (api/read_cache.py), read on
    # the event loop (a WAL-mode read takes well under a millisecond and never
    # waits for writers; a thread hand-off would cost more than the read) and
    # serialised once, without FastAPI re-checking the model it was built as.
    return cached_answer(request, cache, lambda: views.read_job(db=db, job_id=job_id), JOB_TABLES)


def cached_answer(
    request: Request, cache: ReadCache, read: Callable[[], BaseModel], tables: tuple[type, ...]
) -> Response:
    body = cached_json(request, cache, lambda: read().model_dump_json().encode(), tables)
    return Response(body, media_type="application/json")


# What each cached answer is read from. Node rows count for a queued job's
# place and pending numbers; heartbeats do not write them as changes (their
# times are a bulk update once a sweep interval, db/queries.py, note_heard).
JOB_TABLES = (Job, Attempt, Part, Node)
METRICS_TABLES = (Job, ProgressRow)
LOGS_TABLES = (Job, LogRow)


@endpoint(router, route_table.CANCEL_JOB, response_model=JobPublic)
def cancel_job(job_id: JobId, core: CoreDep, db: DatabaseDep, actor: ActorDep) -> JobPublic:
    """Queued jobs end ``cancelled`` at once; running ones go ``cancelling``
    until every node has stopped its ranks. Its owner or an admin only."""
    jobs_core.cancel_job(core, job_id, actor)
    return views.read_job(db=db, job_id=job_id)


@endpoint(router, route_table.UPDATE_JOB, response_model=JobPublic)
def update_job(
    job_id: JobId, update: JobUpdate, core: CoreDep, db: DatabaseDep, actor: ActorDep
) -> JobPublic:
    """Change a queued job's priority (higher first); 409 once it has
    started. Its owner or an admin only."""
    jobs_core.set_priority(core, job_id, update.priority, actor)
    return views.read_job(db=db, job_id=job_id)


@endpoint(router, route_table.JOB_METRICS, response_model=MetricsPublic)
async def get_metrics(
    job_id: JobId,
    request: Request,
    db: DatabaseDep,
    cache: ReadCacheDep,
    max_points: Annotated[int, Query(ge=2, le=10_000)] = 1000,
) -> Response:
    """Rank 0's loss and throughput reports for the current attempt."""
    return cached_answer(
        request,
        cache,
        lambda: views.read_metrics(db=db, job_id=job_id, max_points=max_points),
        METRICS_TABLES,
    )


@endpoint(
    router,
    route_table.JOB_LOGS,
    response_model=LogsPublic,
    responses={
        200: {
            "content": {
                "application/x-ndjson": {
                    "schema": {"description": "with follow=true: one LogLinePublic per line"}
                }
            }
        }
    },
)
async def get_logs(
    job_id: JobId,
    request: Request,
    db: DatabaseDep,
    cache: ReadCacheDep,
    machine_id: Annotated[int | None, Query(ge=0, le=DB_INT_MAX)] = None,
    rank: Annotated[int | None, Query(ge=0, le=DB_INT_MAX, description="global rank")] = None,
    since: Annotated[int, Query(ge=0, le=DB_INT_MAX, description="only lines after this id")] = 0,
    tail: Annotated[int | None, Query(ge=1, le=10_000, description="only the last N")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    follow: Annotated[bool, Query(description="stream new lines until the job ends")] = False,
) -> Response:
    """What the job's ranks (and launchers: ``rank`` null) printed, oldest
    first. Page with ``since=next_since``; ``follow=true`` streams
    newline-delimited JSON lines instead, until the job has ended and every
    line is out."""

    def read() -> LogsPublic:
        return views.read_logs(
            db=db,
            job_id=job_id,
            since=since,
            machine_id=machine_id,
            rank=rank,
            limit=tail or limit,
            tail=tail is not None,
        )

    if not follow:
        return cached_answer(request, cache, read, LOGS_TABLES)
    first = await run_in_threadpool(read)

    async def stream() -> AsyncIterator[str]:
        page = first
        while True:
            for line in page.lines:
                yield line.model_dump_json() + "\n"
            if not page.lines:
                if page.job_status.is_terminal():
                    return
                await asyncio.sleep(FOLLOW_POLL_S)
            page = await run_in_threadpool(
                views.read_logs,
                db=db,
                job_id=job_id,
                since=page.next_since,
                machine_id=machine_id,
                rank=rank,
                limit=limit,
                tail=False,
            )

    return StreamingResponse(stream(), media_type="application/x-ndjson")


@endpoint(
    router,
    route_table.JOB_MODEL,
    response_class=StreamingResponse,
    responses={200: {"content": {"application/octet-stream": {}}}, **documented(403)},
)
def download_model(job_id: JobId, core: CoreDep, caller_node: CallerNodeDep) -> StreamingResponse:
    """The newest checkpoint: ``torch.load(f)["model"]`` is the state_dict
    (after the last epoch of a succeeded job: the final model); it also holds
    the optimizer, epoch, step, spec and RNG state to resume from."""
    if caller_node is not None and not nodes_core.node_holds_job(core, caller_node, job_id):
        # A worker fetches only what its own parts resume from.
        raise HTTPException(403, f"job_id: node {caller_node} runs no part of job {job_id}")
    opened = artifacts.open_checkpoint(core, job_id)

    def blocks() -> Iterator[bytes]:
        with opened.file as file:
            while block := file.read(1 << 20):
                yield block

    headers = {
        "content-length": str(opened.size),
        "content-disposition": f'attachment; filename="job-{job_id}-epoch-{opened.epoch}.pt"',
    }
    if opened.sha256 is not None:
        # For the reader to check what it received (the worker's retry does).
        headers[CHECKPOINT_SHA256_HEADER] = opened.sha256
    return StreamingResponse(blocks(), media_type="application/octet-stream", headers=headers)
