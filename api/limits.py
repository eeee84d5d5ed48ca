"""A cap on request bodies, so that no single client can make the server
read (and hold) an unbounded amount. Checked before any route runs: against
Content-Length when it is sent, and while the body streams in when not."""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.raw_answers import send_problem


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int, exempt: Callable[[str, str], bool]) -> None:
        self.app = app
        self.max_bytes = max_bytes
        # Routes with their own, larger limit (checkpoint uploads).
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            # No route reads a GET's body: nothing to hold, nothing to count.
            or scope["method"] in ("GET", "HEAD")
            or self.exempt(scope["method"], scope["path"])
        ):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._too_large(send)
            return
        received = 0
        refused = False

        async def counted() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Answer now; the route sees the client gone and its
                    # own answer goes nowhere.
                    refused = True
                    await self._too_large(send)
                    return {"type": "http.disconnect"}
            return message

        async def unless_refused(message: Message) -> None:
            if not refused:
                await send(message)

        await self.app(scope, counted, unless_refused)

    async def _too_large(self, send: Send) -> None:
        detail = f"body: larger than {self.max_bytes} bytes (DDPO_MAX_BODY_KB)"
        await send_problem(send, 413, detail, [(b"connection", b"close")])
