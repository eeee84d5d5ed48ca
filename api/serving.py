"""How the server meets its connections: uvicorn's HTTP protocol with the
two timeouts it lacks, and its connection limit.

uvicorn closes a keep-alive connection idle between requests, but not one
that has opened and sent nothing, or half a request, nor one whose reader
has stopped reading: each holds a socket (and, for a reader, the rest of
its answer in memory) for as long as its client likes. A few hundred such
clients would use up the process's file descriptors, and the workers'
polls could not connect. Here a request's head must arrive within
``header_timeout_s`` of the connection opening or the previous answer
going out, and an answer that cannot be written for ``send_timeout_s`` ends
its connection (nginx's ``client_header_timeout`` and ``send_timeout``).

And the limits a slow or greedy client met nowhere (issue 27's review): a
request's head over ``max_header_bytes`` is answered 431 and its connection
closed before the rest is read (a 64 MiB header was answered 200, and four
of 40 MiB stalled the event loop for 12 s); a request answered before its
body arrived (a 401, 403 or 413) has its connection closed rather than the
rest of the body read (a client dripping one byte every few seconds held
its connection for as long as it liked, token or not); a body that stops
arriving for ``body_timeout_s`` ends its connection; and no one address
holds more than ``connections_per_address`` connections (2,100 sockets from
one host took every connection there was).
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import weakref
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from api.settings import ServerSettings

log = logging.getLogger(__name__)


def _raw_problem(status: int, reason: str, detail: str) -> bytes:
    body = json.dumps({"detail": detail}).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


class GuardedHttpTools(HttpToolsProtocol):
    header_timeout_s: float = 10.0
    send_timeout_s: float = 30.0
    body_timeout_s: float = 30.0
    min_body_bytes_per_s: int = 1024
    max_header_bytes: int = 64 * 1024
    connections_per_address: int = 512
    # Open connections per peer address, for every connection of this server.
    by_address: ClassVar[dict[str, int]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        # When the body being read began, and its bytes so far.
        self._body_started = 0.0
        self._body_bytes = 0
        self._in_head = True
        self._head_bytes = 0
        self._address: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        address = peer[0] if isinstance(peer, tuple) and peer else None
        if address is not None:
            held = self.by_address.get(address, 0)
            if held >= self.connections_per_address:
                log.warning(
                    "refusing a connection from %s: it holds %d already "
                    "(DDPO_CONNECTIONS_PER_ADDRESS)",
                    address,
                    held,
                )
                transport.write(
                    _raw_problem(
                        503,
                        "Service Unavailable",
                        f"this address holds {held} connections to the server already "
                        "(DDPO_CONNECTIONS_PER_ADDRESS)",
                    )
                )
                transport.close()
                return
            self.by_address[address] = held + 1
            self._address = address
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return  # refused: nothing more of this connection is read
        if self._in_head:
            end = data.find(b"\r\n\r\n")
            self._head_bytes += len(data) if end < 0 else end + 4
            if self._head_bytes > self.max_header_bytes:
                self._refuse_head()
                return
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_bytes += len(data)
            if self._body_too_slow():
                return
            self._body_timer = self.loop.call_later(self.body_timeout_s, self._body_stalled)
        super().data_received(data)

    def _body_too_slow(self) -> bool:
        """A body that keeps coming, a byte at a time, never stalls: past
        the body timeout it must have come at the minimum rate on average
        (1 KiB/s by default; a checkpoint over a slow link comes at
        hundreds), or its connection ends."""
        elapsed = self.loop.time() - self._body_started
        floor = elapsed * self.min_body_bytes_per_s
        if elapsed <= self.body_timeout_s or self._body_bytes >= floor:
            return False
        self._body_timer = None
        log.info(
            "closing a connection whose body came at %.0f bytes/s for %.0f s "
            "(DDPO_MIN_BODY_BYTES_PER_S=%d)",
            self._body_bytes / elapsed,
            elapsed,
            self.min_body_bytes_per_s,
        )
        self.transport.close()
        return True

    def _refuse_head(self) -> None:
        self._cancel_head_timer()
        self.transport.write(
            _raw_problem(
                431,
                "Request Header Fields Too Large",
                f"headers: the request's head is over {self.max_header_bytes} bytes",
            )
        )
        self.transport.close()

    def on_message_complete(self) -> None:
        self._cancel_body_timer()
        self._in_head, self._head_bytes = True, 0  # the next request's head comes next
        super().on_message_complete()

    def _body_stalled(self) -> None:
        self._body_timer = None
        log.info("closing a connection whose body stopped for %.0f s", self.body_timeout_s)
        self.transport.close()

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_timer is None:  # a request after an idle keep-alive: a new head
            self._await_head()

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        self._in_head = False
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is None or not cycle.more_body:
            return
        self._body_timer = self.loop.call_later(self.body_timeout_s, self._body_stalled)
        self._body_started, self._body_bytes = self.loop.time(), 0
        # The wrapper below is kept on the cycle itself, so it holds the
        # cycle weakly and its send unbound: a closure over the cycle would
        # make a reference loop that outlives the request until the garbage
        # collector's full pass, whose pauses (tens of ms at a thousand
        # held polls) were the slow tail of polls (BENCHMARKS.md).
        this = weakref.ref(cycle)
        answer = RequestResponseCycle.send

        async def send(message: Any) -> None:
            # This request's cycle, not ``self.cycle``: the client may have
            # sent its next request before this answer's last (empty) part.
            current = this()
            if current is None:
                return  # nobody holds the request any more: nothing to answer
            if current.more_body:
                # Answered before its body arrived (a 401, 403, 413): the
                # connection ends with this answer (uvicorn says so and
                # closes it once sent) rather than read the rest for as
                # long as a slow client likes.
                current.keep_alive = False
            await answer(current, message)

        cycle.send = send  # type: ignore[method-assign]

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.send_timeout_s, self._stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._cancel_body_timer()
        if self._address is not None:
            left = self.by_address.get(self._address, 1) - 1
            if left > 0:
                self.by_address[self._address] = left
            else:
                self.by_address.pop(self._address, None)
            self._address = None
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        super().connection_lost(exc)

    def _await_head(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._no_head)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _no_head(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def _stalled(self) -> None:
        self._send_timer = None
        log.info("closing a connection whose reader took no data for %.0f s", self.send_timeout_s)
        self.transport.abort()  # what is left to send is dropped with it


def uvicorn_options(settings: ServerSettings) -> dict[str, Any]:
    """What ``uvicorn.Config`` takes from the settings, for the server and tests."""
    protocol = type(
        "GuardedHttpTools",
        (GuardedHttpTools,),
        {
            "header_timeout_s": settings.header_timeout_s,
            "send_timeout_s": settings.send_timeout_s,
            "body_timeout_s": settings.body_timeout_s,
            "min_body_bytes_per_s": settings.min_body_bytes_per_s,
            "max_header_bytes": settings.max_header_kb * 1024,
            "connections_per_address": settings.connections_per_address,
            # Each server (a test runs several in one process) counts its own.
            "by_address": {},
        },
    )
    return {
        "http": protocol,
        "timeout_keep_alive": settings.keep_alive_s,
        "limit_concurrency": settings.max_connections,
        # uvicorn believes X-Forwarded-For from loopback by default: any local
        # process could then put any address in the audit log.
        "proxy_headers": bool(settings.trusted_proxies),
        "forwarded_allow_ips": settings.trusted_proxies or None,
    }


def allow_open_files(connections: int) -> None:
    """Raise the process's soft limit on open files (often 1,024) toward its
    hard limit, so that ``connections`` sockets fit beside the database's."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        if raised < wanted:
            log.warning(
                "open files are limited to %d: fewer than DDPO_MAX_CONNECTIONS=%d connections fit",
                raised,
                connections,
            )
