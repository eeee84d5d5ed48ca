"""Polls and heartbeats answered before routing.

They are most of what a large cluster sends: every node asks once a poll
wait whether anything changed, and most of the time nothing did. Through
FastAPI each costs routing, dependency solving and a dozen middleware
layers, more CPU than the answer itself (BENCHMARKS.md, "Thousands of
simulated nodes"). This lane sits inside authentication and the body cap,
so it sees only requests whose caller and size were already checked, and
answers a well-formed poll or heartbeat with the same code as the routes
(api/node_answers.py). Anything else, a malformed body, a credential
acting for another node, an unknown query parameter, goes on to FastAPI,
whose answer (422, 403) says what is wrong. Its latency is recorded under
the route's name as FastAPI's would be."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from prometheus_client import Histogram
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import route_table
from api.auth import caller_node
from api.core.context import Core
from api.core.errors import DomainError
from api.node_answers import answer_heartbeat, answer_poll
from api.notifier import Notifier
from api.quiet_nodes import QuietNodes
from api.refusals import refusal
from ddpo.schemas import DB_INT_MAX, HeartbeatRequest, PollRequest

_NODE_ROUTE = re.compile(r"^/nodes/([1-9][0-9]{0,18})/(poll|heartbeat)$")
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
            _NODE_ROUTE.match(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST"
            else None
        )
        if hit is None or scope.get("query_string") or not _json_or_unsaid(scope):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        node_id, kind = int(hit[1]), hit[2]
        own = caller_node(scope.get("state", {}))
        body, ended = await _whole_body(receive)
        request = _parsed(PollRequest if kind == "poll" else HeartbeatRequest, body)
        if node_id > DB_INT_MAX or (own is not None and own != node_id) or request is None:
            await self.app(scope, _replaying(body, ended, receive), send)
            return
        route = route_table.POLL if kind == "poll" else route_table.HEARTBEAT
        try:
            answer = await self._answer(node_id, request)
        except DomainError as exc:  # an unknown or revoked node: as the route's handler says it
            refused = refusal(exc)
            self._observe(route, refused.status_code, started)
            await refused(scope, receive, send)
            return
        payload = answer.model_dump_json().encode()
        self._observe(route, 200, started)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _answer(self, node_id: int, request: PollRequest | HeartbeatRequest) -> BaseModel:
        if isinstance(request, PollRequest):
            return await answer_poll(self.core, self.notifier, self.quiet, node_id, request)
        return await answer_heartbeat(self.core, self.quiet, node_id, request)

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


def _parsed(model: type[PollRequest] | type[HeartbeatRequest], body: bytes) -> Any:
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
