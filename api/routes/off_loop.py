"""Large bodies read in another process.

FastAPI decodes a JSON body and validates it on the event loop. A node's
16 MiB log batch takes about a quarter of a second of that, and eight
million numbers in one array over half a second: every other request, the
nodes' polls and ``/healthz`` included, waits that long, per body. A thread
does not help: the decoder holds the GIL from the first byte to the last
(bench/node_bodies.py measured ``/healthz`` at 1.5 s behind four such
bodies decoded in threads).

So the routes that take large bodies (route_table's ``large_body``: a
node's registration and its log and progress batches) send a body over
:data:`INLINE_BYTES` to a small pool of decoder processes, which decode and
validate it with the route's own model and send back the model (at most
what its limits allow) or the errors (never the input). Smaller bodies,
nearly all of them, are read inline as FastAPI does. The 422 and its
wording are what FastAPI would have given.
"""

from __future__ import annotations

import asyncio
import functools
import json
import multiprocessing
import sys
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

# Below this a body is decoded inline: a few milliseconds at most, less
# than the trip to a decoder process and back.
INLINE_BYTES = 256 * 1024

# A decoder process is replaced after this many bodies: what a huge body
# made its heap grow to is given back.
BODIES_PER_DECODER = 200


class BodyDecoders:
    """The server's decoder processes, started when the first large body
    arrives (most servers never see one) and stopped with the server."""

    def __init__(self, processes: int) -> None:
        self._processes = processes
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                # Python 3.10 cannot replace a decoder: it keeps its heap.
                renew: dict[str, Any] = (
                    {"max_tasks_per_child": BODIES_PER_DECODER}
                    if sys.version_info >= (3, 11)
                    else {}
                )
                self._pool = ProcessPoolExecutor(
                    self._processes,
                    # Not fork: the server has threads (the database's, the
                    # thread pool's) whose locks a forked child would inherit.
                    mp_context=multiprocessing.get_context("spawn"),
                    **renew,
                )
            return self._pool

    async def decode(self, model: Any, raw: bytes) -> Any:
        """``raw`` as an instance of ``model``; RequestValidationError (422)
        or HTTPException (400) as FastAPI would raise them."""
        loop = asyncio.get_running_loop()
        try:
            kind, value = await loop.run_in_executor(self._executor(), _decode, model, raw)
        except BrokenProcessPool:
            # A decoder died (killed, out of memory): the next body gets new ones.
            with self._lock:
                self._pool = None
            raise HTTPException(503, "the server's body decoder stopped; send it again") from None
        if kind == "ok":
            return value
        if kind == "json":
            pos, msg = value
            raise RequestValidationError(
                [
                    {
                        "type": "json_invalid",
                        "loc": ("body", pos),
                        "msg": "JSON decode error",
                        "input": {},
                        "ctx": {"error": msg},
                    }
                ]
            )
        if kind == "invalid":
            raise RequestValidationError(
                [{**error, "loc": ("body", *error["loc"])} for error in value]
            )
        raise HTTPException(400, "There was an error parsing the body")

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


@functools.lru_cache(maxsize=32)
def _adapter(model: Any) -> TypeAdapter[Any]:
    return TypeAdapter(model)


def _decode(model: Any, raw: bytes) -> tuple[str, Any]:
    """In a decoder process: what FastAPI does with a JSON body, answered
    as plain data (errors without the input, which may be the whole body)."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        return "json", (exc.pos, exc.msg)
    except Exception:  # nested past the parser's depth: FastAPI's 400
        return "unparsable", None
    try:
        return "ok", _adapter(model).validate_python(data, from_attributes=True)
    except ValidationError as exc:
        return "invalid", [
            {
                "type": error["type"],
                "loc": tuple(error["loc"]),
                "msg": error["msg"],
                "ctx": {key: str(item) for key, item in error.get("ctx", {}).items()},
            }
            for error in exc.errors(include_url=False)
        ]


class OffLoopBody(APIRoute):
    """A route whose large JSON bodies are decoded in a decoder process."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()
        if self.body_field is None:
            return handle
        model = self.body_field.field_info.annotation

        async def handler(request: Request) -> Response:
            raw = await request.body()
            if len(raw) > INLINE_BYTES and _is_json(request.headers.get("content-type")):
                decoders: BodyDecoders = request.app.state.body_decoders
                # FastAPI takes what request.json() returns as the body, and
                # validating an instance of the body's own model is a no-op.
                request._json = await decoders.decode(model, raw)
            return await handle(request)

        return handler


def _is_json(content_type: str | None) -> bool:
    # FastAPI decodes only these as JSON (anything else is a 422 unread).
    if not content_type:
        return False
    main, _, rest = content_type.partition("/")
    subtype = rest.split(";", 1)[0].strip().lower()
    return main.strip().lower() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )
