"""Reports from workers about the parts they run."""

from __future__ import annotations

import os
import uuid
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from starlette.concurrency import run_in_threadpool

from api.auth import acting_for
from api.deps import CallerNodeDep, CoordinatorDep, NotifierDep, PartId, SettingsDep
from api.schemas import (
    DB_INT_MAX,
    Ack,
    LogBatch,
    PartFinished,
    PartStarted,
    ProgressBatch,
    RendezvousBound,
    documented,
)

router = APIRouter(
    prefix="/parts", tags=["worker protocol"], responses=documented(400, 403, 404, 409, 413)
)


@router.post("/{part_id}/started", response_model=Ack)
def part_started(
    part_id: PartId, body: PartStarted, coordinator: CoordinatorDep, caller_node: CallerNodeDep
) -> Ack:
    """``accepted: false`` tells the worker the part should not run (it was
    cancelled meanwhile); the next poll lists it under ``stop``."""
    acting_for(caller_node, body.node_id)
    return Ack(accepted=coordinator.part_started(part_id, body.node_id))


@router.post("/{part_id}/rendezvous", response_model=Ack)
def part_rendezvous(
    part_id: PartId,
    body: RendezvousBound,
    coordinator: CoordinatorDep,
    notifier: NotifierDep,
    caller_node: CallerNodeDep,
) -> Ack:
    """Machine 0 reports the port its launcher's rendezvous store listens on."""
    acting_for(caller_node, body.node_id)
    accepted = coordinator.record_rendezvous(part_id, body)
    notifier.notify()
    return Ack(accepted=accepted)


@router.post("/{part_id}/progress", response_model=Ack)
def part_progress(
    part_id: PartId, body: ProgressBatch, coordinator: CoordinatorDep, caller_node: CallerNodeDep
) -> Ack:
    acting_for(caller_node, body.node_id)
    return Ack(accepted=coordinator.record_progress(part_id, body))


@router.post("/{part_id}/logs", response_model=Ack)
def part_logs(
    part_id: PartId, body: LogBatch, coordinator: CoordinatorDep, caller_node: CallerNodeDep
) -> Ack:
    """Lines the part's ranks and launcher printed; resent lines are ignored."""
    acting_for(caller_node, body.node_id)
    return Ack(accepted=coordinator.record_logs(part_id, body))


@router.post("/{part_id}/finish", response_model=Ack)
def part_finished(
    part_id: PartId,
    body: PartFinished,
    coordinator: CoordinatorDep,
    notifier: NotifierDep,
    caller_node: CallerNodeDep,
) -> Ack:
    acting_for(caller_node, body.node_id)
    accepted = coordinator.finish_part(part_id, body)
    notifier.notify()
    return Ack(accepted=accepted)


@router.put(
    "/{part_id}/checkpoint",
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
    coordinator: CoordinatorDep,
    settings: SettingsDep,
    caller_node: CallerNodeDep,
    node_id: Annotated[int, Query(ge=1, le=DB_INT_MAX)],
    epoch: Annotated[int, Query(ge=1, le=DB_INT_MAX)],
) -> Ack:
    """Rank 0's checkpoint after ``epoch``, as the raw bytes torch.save wrote.
    The newest one is served at ``GET /jobs/{id}/model``."""
    acting_for(caller_node, node_id)
    await run_in_threadpool(coordinator.check_checkpoint_upload, part_id, node_id)
    limit = settings.max_checkpoint_mb * 2**20
    incoming = settings.artifacts_dir / ".incoming"
    incoming.mkdir(parents=True, exist_ok=True)
    staged = incoming / uuid.uuid4().hex
    size = 0
    try:
        with open(staged, "wb") as f:
            async for chunk in request.stream():
                # Bytes arriving are a live node, over however slow a link.
                coordinator.saw(node_id)
                size += len(chunk)
                if size > limit:
                    raise HTTPException(
                        413,
                        "body: checkpoint larger than "
                        f"DDPO_MAX_CHECKPOINT_MB={settings.max_checkpoint_mb}",
                    )
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        if size == 0:
            raise HTTPException(400, "body: the checkpoint is empty")
        accepted = await run_in_threadpool(
            coordinator.record_checkpoint, part_id, node_id, epoch, staged, size
        )
    finally:
        staged.unlink(missing_ok=True)
    return Ack(accepted=accepted)
