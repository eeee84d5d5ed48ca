"""The queue as users see it: every queued job in the order it is tried."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from api import route_table, views
from api.deps import DatabaseDep, ReadCacheDep
from api.routes import endpoint
from api.routes.jobs import JOB_TABLES, cached_answer
from ddpo.schemas.public import QueuePublic

router = APIRouter(tags=["jobs"])


@endpoint(router, route_table.QUEUE, response_model=QueuePublic)
async def get_queue(request: Request, db: DatabaseDep, cache: ReadCacheDep) -> Response:
    """Queued jobs in the order placement tries them (higher priority first,
    then first in, first out), each with its position, what it needs, and
    why it waits: a code, the numbers (nodes needed, suitable, free, live)
    and the sentence. Shared until the next write, as ``GET /jobs/{id}``."""
    return cached_answer(request, cache, lambda: views.read_queue(db=db), JOB_TABLES)
