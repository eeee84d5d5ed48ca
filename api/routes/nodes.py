"""Nodes: what users see of them, and how workers join and poll."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from api import route_table, views
from api.auth import acting_for
from api.core import nodes as nodes_core
from api.deps import (
    ActorDep,
    CallerNodeDep,
    CoreDep,
    DatabaseDep,
    NodeId,
    NotifierDep,
    QuietNodesDep,
    SettingsDep,
)
from api.node_answers import answer_heartbeat, answer_poll
from api.routes import endpoint
from ddpo.lifecycle import NodeState
from ddpo.schemas import (
    DB_INT_MAX,
    Ack,
    HeartbeatRequest,
    HeartbeatResponse,
    NodePublic,
    NodeRegistered,
    NodeRegistration,
    NodesPublic,
    PollRequest,
    PollResponse,
    documented,
)
from ddpo.schemas.protocol import NodeLeaving
from ddpo.schemas.public import NodeDrain

router = APIRouter(prefix="/nodes", tags=["nodes"], responses=documented(400, 403, 404))


@endpoint(router, route_table.LIST_NODES, response_model=NodesPublic)
def list_nodes(
    db: DatabaseDep,
    settings: SettingsDep,
    state: NodeState | None = None,
    limit: Annotated[int, Query(ge=1, le=DB_INT_MAX)] = 100,
    offset: Annotated[int, Query(ge=0, le=DB_INT_MAX)] = 0,
) -> NodesPublic:
    """Oldest first, a page at a time (at most DDPO_MAX_PAGE_SIZE)."""
    return views.read_nodes(
        db=db, state=state, limit=min(limit, settings.max_page_size), offset=offset
    )


@endpoint(
    router, route_table.REGISTER_NODE, response_model=NodeRegistered, responses=documented(409, 429)
)
def register_node(
    registration: NodeRegistration,
    request: Request,
    core: CoreDep,
    settings: SettingsDep,
    caller_node: CallerNodeDep,
) -> NodeRegistered:
    """A machine joins with the join token and gets its node's credential;
    a restarted worker registers again presenting that credential."""
    node_id, credential = nodes_core.register_node(
        core, registration, caller_node, enforce=request.app.state.tokens.enabled
    )
    return NodeRegistered(
        node_id=node_id,
        credential=credential,
        heartbeat_timeout_s=settings.heartbeat_timeout_s,
        poll_wait_s=settings.poll_wait_s,
        heartbeat_interval_s=settings.heartbeat_interval_s,
    )


@endpoint(router, route_table.REVOKE_NODE, response_model=NodePublic)
def revoke_node(node_id: NodeId, core: CoreDep, db: DatabaseDep, actor: ActorDep) -> NodePublic:
    """Refuse the node's credential from now on and retire its name; its
    parts' jobs restart elsewhere if they have restarts left."""
    nodes_core.revoke_node(core, node_id, actor)
    return views.read_node(db=db, node_id=node_id)


@endpoint(router, route_table.DRAIN_NODE, response_model=NodePublic, responses=documented(409))
def drain_node(
    node_id: NodeId, drain: NodeDrain, core: CoreDep, db: DatabaseDep, actor: ActorDep
) -> NodePublic:
    """Take the node out of service (admins): it takes no new part; its
    parts run until ``deadline_s`` from now, then their jobs stop at a step,
    checkpoint, and start again elsewhere from that step (no restart used)."""
    nodes_core.drain_node(core, node_id, drain.deadline_s, actor)
    return views.read_node(db=db, node_id=node_id)


@endpoint(router, route_table.UNDRAIN_NODE, response_model=NodePublic, responses=documented(409))
def undrain_node(node_id: NodeId, core: CoreDep, db: DatabaseDep, actor: ActorDep) -> NodePublic:
    """Put a drained node back in service: it takes parts again."""
    nodes_core.undrain_node(core, node_id, actor)
    return views.read_node(db=db, node_id=node_id)


@endpoint(router, route_table.LEAVE, response_model=Ack)
def leave(node_id: NodeId, leaving: NodeLeaving, core: CoreDep, caller_node: CallerNodeDep) -> Ack:
    """The node's worker is shutting down (SIGTERM): its parts' jobs stop
    at a step within ``grace_s`` and start again elsewhere; it takes no new
    part until its worker registers again."""
    acting_for(caller_node, node_id)
    nodes_core.leave(core, node_id, leaving.grace_s)
    return Ack()


@endpoint(router, route_table.HEARTBEAT, response_model=HeartbeatResponse)
async def heartbeat(
    node_id: NodeId,
    request: HeartbeatRequest,
    core: CoreDep,
    quiet: QuietNodesDep,
    caller_node: CallerNodeDep,
) -> HeartbeatResponse:
    """The node is alive (sent every ``heartbeat_interval_s`` by the worker's
    own thread, whatever its main loop is doing); answered at once with the
    parts it runs that it must stop."""
    acting_for(caller_node, node_id)
    return await answer_heartbeat(core, quiet, node_id, request)


@endpoint(router, route_table.POLL, response_model=PollResponse)
async def poll(
    node_id: NodeId,
    request: PollRequest,
    core: CoreDep,
    notifier: NotifierDep,
    quiet: QuietNodesDep,
    caller_node: CallerNodeDep,
) -> PollResponse:
    """Heartbeat and ask for work. Held open up to ``wait_s`` (capped by the
    server) until there is something to start or stop, so news reaches the
    node at once without it hammering the server."""
    acting_for(caller_node, node_id)
    return await answer_poll(core, notifier, quiet, node_id, request)
