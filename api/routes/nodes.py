"""Nodes: what users see of them, and how workers join and poll."""

from __future__ import annotations

import time

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from api import views
from api.deps import CoordinatorDep, DatabaseDep, NodeId, NotifierDep, SettingsDep
from api.schemas import (
    NodePublic,
    NodeRegistered,
    NodeRegistration,
    PollRequest,
    PollResponse,
    documented,
)

router = APIRouter(prefix="/nodes", tags=["nodes"], responses=documented(400, 404))


@router.get("", response_model=list[NodePublic])
def list_nodes(db: DatabaseDep) -> list[NodePublic]:
    return views.read_nodes(db=db)


@router.post("/register", response_model=NodeRegistered)
def register_node(
    registration: NodeRegistration,
    coordinator: CoordinatorDep,
    settings: SettingsDep,
    notifier: NotifierDep,
) -> NodeRegistered:
    node_id = coordinator.register_node(registration)
    notifier.notify()
    return NodeRegistered(
        node_id=node_id,
        heartbeat_timeout_s=settings.heartbeat_timeout_s,
        poll_wait_s=settings.poll_wait_s,
    )


@router.post("/{node_id}/poll", response_model=PollResponse)
async def poll(
    node_id: NodeId,
    request: PollRequest,
    coordinator: CoordinatorDep,
    settings: SettingsDep,
    notifier: NotifierDep,
) -> PollResponse:
    """Heartbeat and ask for work. Held open up to ``wait_s`` (capped by the
    server) until there is something to start or stop, so news reaches the
    node at once without it hammering the server."""
    deadline = time.monotonic() + min(request.wait_s, settings.poll_wait_s)
    while True:
        event = notifier.current()
        response = await run_in_threadpool(
            coordinator.poll_node, node_id, request.active_part_ids, request.waiting_for_port
        )
        remaining = deadline - time.monotonic()
        if response.start or response.stop or response.rendezvous or remaining <= 0:
            return response
        await notifier.wait(event, remaining)
