"""Answers sent straight over ASGI, by the middleware that refuses a request
before any route sees it. Same shape as FastAPI's errors: ``{"detail": ...}``."""

from __future__ import annotations

import json

from starlette.types import Send


async def send_problem(
    send: Send, status: int, detail: str, extra_headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *(extra_headers or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
