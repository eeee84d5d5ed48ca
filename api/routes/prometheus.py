"""``GET /metrics`` in Prometheus's text format."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from api import route_table
from api.routes import endpoint

router = APIRouter(tags=["monitoring"])


@endpoint(
    router,
    route_table.PROMETHEUS,
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}},
)
async def prometheus_metrics(request: Request) -> Response:
    """Jobs by state, queue length, nodes by state, claims (from the
    database at scrape time) and request latency by route."""
    body = await run_in_threadpool(generate_latest, request.app.state.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
