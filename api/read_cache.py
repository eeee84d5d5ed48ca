"""Answers to the GETs dashboards poll, kept until the database's next write
or a second, whichever comes first.

Fifty dashboards on one job ask the same question fifty times a second; the
answer changes only when one of the tables it is read from is written (a
progress report, a finish), about once a second. Keying each answer to the
database's count of writes to those tables makes a cached answer exactly as
fresh as a new read: a read that began before such a write committed is never
served after it. The time limit bounds the fields computed from the clock
(running time, ETA): a second, the period dashboards poll at. Each miss goes
through routing and validation (about 1.5 ms), and at half a second the limit
made twice as many (BENCHMARKS.md, "50 dashboards").

``ReadCacheMiddleware`` answers a GET whose answer is cached before any other
middleware, routing, validation and dependencies run; route handlers fill the
cache. Anything that must see every request (authentication, say) has to sit
in front of it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any
from urllib.parse import parse_qsl

from prometheus_client import Histogram
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from api.monitoring import route_template
from db.engine import Database

TTL_S = 1.0
MAX_ENTRIES = 1024
# Whatever the answers' sizes and however many distinct queries arrive, the
# cache holds at most this much (a client varying the query string makes a
# new entry each time).
MAX_BYTES = 16 * 2**20
# Dropping this much at once is worth handing freed memory back (give_back_freed_memory).
TRIM_AFTER_BYTES = 4 * 2**20


def give_back_freed_memory() -> None:
    """Hand the heap's free pages back to the kernel (glibc's malloc_trim).
    glibc keeps freed memory for reuse, and after freeing large blocks it
    serves the next ones from the heap rather than fresh mappings: after a
    burst of large answers the server's RSS would stay at the burst's
    height. A few milliseconds; a no-op off glibc."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class ReadCache:
    def __init__(
        self,
        db: Database,
        ttl_s: float = TTL_S,
        max_entries: int = MAX_ENTRIES,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self.db = db
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._bytes = 0
        # key -> (the tables it was read from, their write counts, when, the
        # answer, the route that made it)
        self._entries: OrderedDict[
            Hashable, tuple[tuple[type, ...], tuple[int, ...], float, bytes, Any]
        ] = OrderedDict()
        self._lock = threading.Lock()

    def peek(self, key: Hashable) -> tuple[bytes, Any] | None:
        """The answer and its route, if one is cached and still fresh."""
        with self._lock:
            entry = self._entries.get(key)
            if (
                entry is None
                or self.db.writes_to(entry[0]) != entry[1]
                or time.monotonic() - entry[2] >= self.ttl_s
            ):
                return None
            return entry[3], entry[4]

    def get(
        self,
        key: Hashable,
        compute: Callable[[], bytes],
        tables: tuple[type, ...],
        route: Any = None,
    ) -> bytes:
        """``compute`` reads ``tables`` (all of them: a table left out would
        not make the answer stale when written)."""
        writes = self.db.writes_to(tables)  # before reading: later writes make it stale
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[1] == writes and now - entry[2] < self.ttl_s:
                return entry[3]
        body = compute()  # an exception (404, ...) is not cached
        if len(body) > self.max_bytes:
            return body
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= len(old[3])
            self._entries[key] = (tables, writes, now, body, route)
            self._bytes += len(body)
            self._drop_old()
        return body

    def drop_expired(self) -> int:
        """Let go of answers past their time (the server's clock calls this:
        a burst of reads then silence must not keep its answers); the bytes
        let go of."""
        with self._lock:
            before = self._bytes
            self._drop_old()
            return before - self._bytes

    def _drop_old(self) -> None:
        # Oldest first: what is past its time, then what is over the bounds.
        while self._entries:
            oldest = next(iter(self._entries.values()))
            expired = time.monotonic() - oldest[2] >= self.ttl_s
            if not (
                expired or len(self._entries) > self.max_entries or self._bytes > self.max_bytes
            ):
                break
            _, dropped = self._entries.popitem(last=False)
            self._bytes -= len(dropped[3])

    @property
    def size_bytes(self) -> int:
        """The bytes of the answers held now."""
        with self._lock:
            return self._bytes


def request_key(scope: Scope) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The path and the query's parameters in order of name: the same
    question asked with its parameters in another order is the same entry.
    Routes refuse parameters they do not declare (api/deps.py), so only
    those can ever be part of a key."""
    query = parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)
    return scope["path"], tuple(sorted(query))


def cached_json(
    request: Request, cache: ReadCache, compute: Callable[[], bytes], tables: tuple[type, ...]
) -> bytes:
    """For a route handler: the cached answer to this request, or a new one."""
    return cache.get(request_key(request.scope), compute, tables, request.scope.get("route"))


class ReadCacheMiddleware:
    """Outermost but for authentication: a hit skips even the error and
    latency middleware (together they cost as much as the hit), so it times
    itself into the same latency histogram."""

    def __init__(self, app: ASGIApp, cache: ReadCache, latency: Histogram) -> None:
        self.app = app
        self.cache = cache
        self.latency = latency

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET":
            started = time.perf_counter()
            hit = self.cache.peek(request_key(scope))
            if hit is not None:
                body, route = hit
                await send(
                    {
                        "type": "http.response.start",
                        "status": 200,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                self.latency.labels("GET", route_template(route), "200").observe(
                    time.perf_counter() - started
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
