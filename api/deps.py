"""Per-request wiring: what a route needs, taken from the app's state."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError

from api.auth import caller_node, caller_of_request
from api.core.context import Core
from api.core.people import Actor
from api.notifier import Notifier
from api.quiet_nodes import QuietNodes
from api.read_cache import ReadCache
from api.settings import ServerSettings
from db.engine import Database
from ddpo.schemas import DB_INT_MAX

# The dependencies are coroutines, though none awaits: FastAPI runs a plain
# function dependency in the thread pool, a hop per dependency per request.


async def get_core(request: Request) -> Core:
    core: Core = request.app.state.core
    return core


async def get_db(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


async def get_notifier(request: Request) -> Notifier:
    notifier: Notifier = request.app.state.notifier
    return notifier


async def get_quiet_nodes(request: Request) -> QuietNodes:
    quiet: QuietNodes = request.app.state.quiet_nodes
    return quiet


async def get_read_cache(request: Request) -> ReadCache:
    cache: ReadCache = request.app.state.read_cache
    return cache


async def get_settings(request: Request) -> ServerSettings:
    settings: ServerSettings = request.app.state.settings
    return settings


async def refuse_unknown_query(request: Request) -> None:
    """422 for a query parameter the route does not declare: a typo should
    not pass for a filter, and a client varying a name nothing reads must
    not make the read cache hold a new answer for each value."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    unknown = sorted(set(request.query_params) - _declared_query(dependant))
    if unknown:
        raise RequestValidationError(
            [
                {
                    "type": "extra_forbidden",
                    "loc": ("query", name),
                    "msg": "unknown query parameter",
                }
                for name in unknown
            ]
        )


def _declared_query(dependant: Dependant) -> set[str]:
    names = {field.alias for field in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _declared_query(sub)
    return names


async def get_caller_node(request: Request) -> int | None:
    """The node whose credential sent the request (None: not a node's)."""
    return caller_node(request.scope.get("state", {}))


async def get_actor(request: Request) -> Actor:
    """Who asks, for the owner checks and the audit log: the caller the
    auth layer found, and the address the request came from."""
    caller = caller_of_request(request.scope.get("state", {}))
    address = request.client.host if request.client else None
    if caller is None:
        return Actor(name=None, role=None, address=address)
    return Actor(name=caller.name, role=caller.role, address=address)


CoreDep = Annotated[Core, Depends(get_core)]
DatabaseDep = Annotated[Database, Depends(get_db)]
NotifierDep = Annotated[Notifier, Depends(get_notifier)]
QuietNodesDep = Annotated[QuietNodes, Depends(get_quiet_nodes)]
SettingsDep = Annotated[ServerSettings, Depends(get_settings)]
ReadCacheDep = Annotated[ReadCache, Depends(get_read_cache)]
CallerNodeDep = Annotated[int | None, Depends(get_caller_node)]
ActorDep = Annotated[Actor, Depends(get_actor)]

JobId = Annotated[int, Path(ge=1, le=DB_INT_MAX)]
NodeId = Annotated[int, Path(ge=1, le=DB_INT_MAX)]
PartId = Annotated[int, Path(ge=1, le=DB_INT_MAX)]
KeyId = Annotated[int, Path(ge=1, le=DB_INT_MAX)]
