"""A cap on request bodies, so that no single client can make the server
read (and hold) an unbounded amount. Checked before any route runs: against
Content-Length when it is sent, and while the body streams in when not."""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.raw_answers import send_problem


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, cap_for: Callable[[str, str], tuple[int, str] | None]) -> None:
        self.app = app
        # A route's cap in bytes and the setting that sets it; None: the
        # route has its own (checkpoint uploads).
        self.cap_for = cap_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        cap = (
            None
            if scope["type"] != "http"
            # No route reads a GET's body: nothing to hold, nothing to count.
            or scope["method"] in ("GET", "HEAD")
            else self.cap_for(scope["method"], scope["path"])
        )
        if cap is None:
            await self.app(scope, receive, send)
            return
        max_bytes, setting = cap
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > max_bytes):
            await _too_large(send, max_bytes, setting)
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
                if received > max_bytes:
                    # Answer now; the route sees the client gone and its
                    # own answer goes nowhere.
                    refused = True
                    await _too_large(send, max_bytes, setting)
                    return {"type": "http.disconnect"}
            return message

        async def unless_refused(message: Message) -> None:
            if not refused:
                await send(message)

        await self.app(scope, counted, unless_refused)


async def _too_large(send: Send, max_bytes: int, setting: str) -> None:
    detail = f"body: larger than {max_bytes} bytes ({setting})"
    await send_problem(send, 413, detail, [(b"connection", b"close")])
