"""Reports from workers about the parts they run."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from api import route_table
from api.auth import acting_for
from api.core import artifacts, reports, runs
from api.core.context import Core
from api.deps import CallerNodeDep, CoreDep, PartId, SettingsDep
from api.routes import endpoint
from ddpo.schemas import (
    DB_INT_MAX,
    Ack,
    CheckpointStored,
    LogBatch,
    PartFinished,
    PartStarted,
    ProgressBatch,
    RendezvousBound,
    TrackingRun,
    documented,
)

router = APIRouter(
    prefix="/parts", tags=["worker protocol"], responses=documented(400, 403, 404, 409, 413)
)


@endpoint(router, route_table.PART_STARTED, response_model=Ack)
def part_started(
    part_id: PartId, body: PartStarted, core: CoreDep, caller_node: CallerNodeDep
) -> Ack:
    """``accepted: false`` tells the worker the part should not run (it was
    cancelled meanwhile); the next poll lists it under ``stop``."""
    acting_for(caller_node, body.node_id)
    return Ack(accepted=reports.part_started(core, part_id, body.node_id))


@endpoint(router, route_table.PART_RENDEZVOUS, response_model=Ack)
def part_rendezvous(
    part_id: PartId, body: RendezvousBound, core: CoreDep, caller_node: CallerNodeDep
) -> Ack:
    """Machine 0 reports the port its launcher's rendezvous store listens on."""
    acting_for(caller_node, body.node_id)
    return Ack(accepted=reports.record_rendezvous(core, part_id, body))


@endpoint(router, route_table.PART_PROGRESS, response_model=Ack)
def part_progress(
    part_id: PartId, body: ProgressBatch, core: CoreDep, caller_node: CallerNodeDep
) -> Ack:
    """Rank 0's reports: machine 0's node alone sends them (403 for another
    machine's, as for a result in its finish)."""
    acting_for(caller_node, body.node_id)
    return Ack(accepted=reports.record_progress(core, part_id, body))


@endpoint(router, route_table.PART_LOGS, response_model=Ack, responses=documented(429))
def part_logs(part_id: PartId, body: LogBatch, core: CoreDep, caller_node: CallerNodeDep) -> Ack:
    """Lines the part's ranks and launcher printed; resent lines are ignored."""
    acting_for(caller_node, body.node_id)
    return Ack(accepted=reports.record_logs(core, part_id, body))


@endpoint(router, route_table.PART_FINISH, response_model=Ack)
def part_finished(
    part_id: PartId, body: PartFinished, core: CoreDep, caller_node: CallerNodeDep
) -> Ack:
    """The part's processes have exited: its outcome settles the job."""
    acting_for(caller_node, body.node_id)
    return Ack(accepted=reports.finish_part(core, part_id, body))


@endpoint(
    router,
    route_table.PART_CHECKPOINT,
    response_model=Ack,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
)
async def upload_checkpoint(
    part_id: PartId,
    request: Request,
    core: CoreDep,
    settings: SettingsDep,
    caller_node: CallerNodeDep,
    node_id: Annotated[int, Query(ge=1, le=DB_INT_MAX)],
    epoch: Annotated[int, Query(ge=1, le=DB_INT_MAX)],
    step: Annotated[
        int | None,
        Query(
            ge=0,
            le=DB_INT_MAX,
            description="A stop's checkpoint: taken after this step, within ``epoch``",
        ),
    ] = None,
) -> Ack:
    """Rank 0's checkpoint after ``epoch`` (or, with ``step``, within it),
    as the raw bytes torch.save wrote. The newest one is served at
    ``GET /jobs/{id}/model``."""
    acting_for(caller_node, node_id)
    at = artifacts.Position(epoch, step)
    await run_in_threadpool(artifacts.check_upload, core, part_id, node_id, at)
    if not core.uploads.begin(part_id):
        raise HTTPException(409, f"part {part_id} is uploading a checkpoint already")
    staged = artifacts.staging_path(settings)
    try:
        size, sha256 = await _receive(request, core, part_id, node_id, staged)
        accepted = await run_in_threadpool(
            artifacts.keep_checkpoint, core, part_id, node_id, at, staged, size, sha256
        )
    finally:
        core.uploads.end(part_id)
        staged.unlink(missing_ok=True)
    return Ack(accepted=accepted)


@contextlib.contextmanager
def _cut_off_is_a_400() -> Iterator[None]:
    """A node that went away mid-upload is a client's doing, not the server's."""
    try:
        yield
    except ClientDisconnect:
        raise HTTPException(400, "body: the upload was cut off before its end") from None


async def _receive(
    request: Request, core: Core, part_id: int, node_id: int, staged: Path
) -> tuple[int, str]:
    """The upload's bytes into ``staged``, within the size cap and the
    quota; their number and SHA-256."""
    settings = core.settings
    limit = settings.max_checkpoint_mb * 2**20
    room = await run_in_threadpool(artifacts.room_for_uploads, core)
    size = 0
    digest = hashlib.sha256()
    with open(staged, "wb") as f, _cut_off_is_a_400():
        async for chunk in request.stream():
            # Bytes arriving are a live node, over however slow a link.
            core.sightings.saw(node_id)
            size += len(chunk)
            if size > limit:
                raise HTTPException(
                    413,
                    "body: checkpoint larger than "
                    f"DDPO_MAX_CHECKPOINT_MB={settings.max_checkpoint_mb}",
                )
            if not core.uploads.grow(part_id, size, room()):
                raise HTTPException(
                    413,
                    "body: the checkpoints kept and arriving would pass "
                    f"DDPO_ARTIFACTS_QUOTA_MB={settings.artifacts_quota_mb}",
                )
            digest.update(chunk)
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    if size == 0:
        raise HTTPException(400, "body: the checkpoint is empty")
    return size, digest.hexdigest()


@endpoint(router, route_table.PART_CHECKPOINT_STORED, response_model=Ack, responses=documented(503))
def checkpoint_stored(
    part_id: PartId, body: CheckpointStored, core: CoreDep, caller_node: CallerNodeDep
) -> Ack:
    """Machine 0 wrote rank 0's checkpoint to the artifact store itself (the
    assignment's ``checkpoint_store``): the server checks the object is the
    job's and of the size reported, then keeps the record; no bytes pass
    through it. ``accepted: false``: a stale attempt's, or older than the
    kept one (the object is removed)."""
    acting_for(caller_node, body.node_id)
    return Ack(accepted=artifacts.record_stored(core, part_id, body))


@endpoint(router, route_table.PART_TRACKING_RUN, response_model=TrackingRun)
def tracking_run(
    part_id: PartId, body: PartStarted, core: CoreDep, caller_node: CallerNodeDep
) -> TrackingRun:
    """The job's MLflow run (made now if it has none), for the node to give
    its part's ranks as MLFLOW_TRACKING_URI and MLFLOW_RUN_ID. ``run_id``
    null: no tracking server, or it cannot be reached now (the job runs
    untracked rather than wait)."""
    acting_for(caller_node, body.node_id)
    return runs.for_part(core, part_id, body.node_id)
