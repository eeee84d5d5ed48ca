"""Polls, heartbeats and a part's "started" and "finished" answered before
routing.

Polls and heartbeats are most of what a large cluster sends: every node
asks once a poll wait whether anything changed, and most of the time
nothing did. A part's start and finish are two of the four requests each
placed job costs (with its submit and the poll that hands it out). Through
FastAPI each costs routing, dependency solving and a dozen middleware
layers, more CPU than the answer itself (BENCHMARKS.md, "Thousands of
simulated nodes" and "Placements at 5,000 nodes"). This lane sits inside
authentication and the body cap, so it sees only requests whose caller and
size were already checked, and answers a well-formed one with the same
code as the routes (api/node_answers.py, api/core/reports.py). Anything
else, a malformed body, a credential acting for another node, an unknown
query parameter, goes on to FastAPI, whose answer (422, 403) says what is
wrong. Its latency is recorded under the route's name as FastAPI's would
be."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from prometheus_client import Histogram
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import route_table
from api.auth import caller_node
from api.core import reports
from api.core.context import Core
from api.core.errors import DomainError
from api.node_answers import answer_heartbeat, answer_poll
from api.notifier import Notifier
from api.quiet_nodes import QuietNodes
from api.refusals import refusal
from ddpo.lifecycle import IllegalTransition
from ddpo.schemas import (
    DB_INT_MAX,
    Ack,
    HeartbeatRequest,
    PartFinished,
    PartStarted,
    PollRequest,
)

# A node's own routes name it in the path; a part's name the part there
# and the node it acts for in the body.
_LANE_ROUTE = re.compile(
    r"^/(?:nodes/([1-9][0-9]{0,18})/(poll|heartbeat)|parts/([1-9][0-9]{0,18})/(started|finish))$"
)
_LANE: dict[str, tuple[route_table.Route, type[BaseModel]]] = {
    "poll": (route_table.POLL, PollRequest),
    "heartbeat": (route_table.HEARTBEAT, HeartbeatRequest),
    "started": (route_table.PART_STARTED, PartStarted),
    "finish": (route_table.PART_FINISH, PartFinished),
}
_JSON_BODY = re.compile(rb"^application/(?:[\w.+-]+\+)?json\s*(?:;.*)?$", re.IGNORECASE)


class NodeLane:
    def __init__(
        self,
        app: ASGIApp,
        core: Core,
        notifier: Notifier,
        quiet: QuietNodes,
        latency: Histogram,
    ) -> None:
        self.app = app
        self.core = core
        self.notifier = notifier
        self.quiet = quiet
        self.latency = latency

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hit = (
            _LANE_ROUTE.match(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST"
            else None
        )
        if hit is None or scope.get("query_string") or not _json_or_unsaid(scope):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        kind = hit[2] or hit[4]
        path_id = int(hit[1] or hit[3])
        route, model = _LANE[kind]
        own = caller_node(scope.get("state", {}))
        body, ended = await _whole_body(receive)
        request = _parsed(model, body)
        if (
            path_id > DB_INT_MAX
            or request is None
            or (own is not None and own != (path_id if hit[1] else request.node_id))
        ):
            await self.app(scope, _replaying(body, ended, receive), send)
            return
        try:
            answer = await self._answer(path_id, request)
        except (DomainError, IllegalTransition) as exc:
            # An unknown or revoked node, another node's part: as the
            # routes' exception handlers say it.
            refused = refusal(exc)
            self._observe(route, refused.status_code, started)
            await refused(scope, receive, send)
            return
        except Exception:
            # Answered 500 by the server (and logged), counted as FastAPI's
            # error middleware's would be.
            self._observe(route, 500, started)
            raise
        payload = answer.model_dump_json().encode()
        self._observe(route, 200, started)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _answer(self, path_id: int, request: BaseModel) -> BaseModel:
        if isinstance(request, PollRequest):
            return await answer_poll(self.core, self.notifier, self.quiet, path_id, request)
        if isinstance(request, HeartbeatRequest):
            return await answer_heartbeat(self.core, self.quiet, path_id, request)
        # A part's reports write: in the thread pool, as FastAPI runs the
        # routes' (synchronous) handlers.
        if isinstance(request, PartStarted):
            accepted = await run_in_threadpool(
                reports.part_started, self.core, path_id, request.node_id
            )
        else:
            assert isinstance(request, PartFinished)
            accepted = await run_in_threadpool(reports.finish_part, self.core, path_id, request)
        return Ack(accepted=accepted)

    def _observe(self, route: route_table.Route, status: int, started: float) -> None:
        """As api/monitoring.py's LatencyMiddleware times the routes' answers."""
        self.latency.labels("POST", route.path, str(status)).observe(time.perf_counter() - started)


def _json_or_unsaid(scope: Scope) -> bool:
    """A body sent as JSON, or without a content type (as FastAPI reads it)."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            return _JSON_BODY.match(value) is not None
    return True


async def _whole_body(receive: Receive) -> tuple[bytes, Message | None]:
    """The request's body (already capped by the body limit outside), and
    the message that ended it early (a disconnect), if one did."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), message
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), None


def _parsed(model: type[BaseModel], body: bytes) -> Any:
    """The body as ``model``, or None: FastAPI says what is wrong with it."""
    try:
        return model.model_validate(json.loads(body))
    except (ValueError, ValidationError, RecursionError):
        # JSONDecodeError and UnicodeDecodeError are ValueErrors; RecursionError
        # is JSON nested past the parser's depth (FastAPI answers 400).
        return None


def _replaying(body: bytes, ended: Message | None, receive: Receive) -> Receive:
    """``receive`` as it was before the lane read the body."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            if ended is not None and not body:
                return ended
            return {"type": "http.request", "body": body, "more_body": ended is not None}
        if ended is not None:
            return ended
        return await receive()

    return replay
