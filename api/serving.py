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
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from api.settings import ServerSettings

log = logging.getLogger(__name__)


class GuardedHttpTools(HttpToolsProtocol):
    header_timeout_s: float = 10.0
    send_timeout_s: float = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_timer is None:  # a request after an idle keep-alive: a new head
            self._await_head()

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        super().on_headers_complete()

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
        {"header_timeout_s": settings.header_timeout_s, "send_timeout_s": settings.send_timeout_s},
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
