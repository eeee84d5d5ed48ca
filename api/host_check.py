"""Requests a page in the user's browser makes, from elsewhere, to this
server. Loopback is no boundary for a browser on the same machine:

- ``HostCheck``: the ``Host`` a request names must be one this server
  answers to. A page can point a name of its own at 127.0.0.1 (DNS
  rebinding) and reach a loopback server as "its own" origin; the browser
  still sends that name as the Host, and it is refused here (400).
- ``OriginCheck``: a write (anything but GET, HEAD, OPTIONS) that a browser
  sends from a page of another origin is refused (403) unless
  ``DDPO_CORS_ORIGINS`` names that origin. Browsers send ``Origin`` with
  every such request, a plain HTML form's or a ``no-cors`` fetch's too,
  which need no preflight; curl, the CLI and workers send none.
"""

from __future__ import annotations

import socket

from starlette.types import ASGIApp, Receive, Scope, Send

from api.raw_answers import send_problem

WILDCARD_BINDS = ("0.0.0.0", "::", "")
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def allowed_hosts(bound: str, configured: list[str]) -> list[str] | None:
    """The names requests may carry; None: any (the server was told so, or
    binds every address and cannot know the names it is reached by)."""
    if configured:
        return None if "*" in configured else [h.lower() for h in configured]
    if bound in WILDCARD_BINDS:
        return None
    # This machine's own name too: on many hosts it resolves to 127.0.0.1,
    # and no page can make a browser send it for a name of the page's.
    return sorted({bound.lower(), *LOOPBACK_NAMES, socket.gethostname().lower()})


def host_of(header: str) -> str:
    """The name in a Host header, without its port (``[::1]:8000`` -> ``::1``)."""
    if header.startswith("["):
        return header[1:].partition("]")[0].lower()
    return header.rpartition(":")[0].lower() if header.count(":") == 1 else header.lower()


class HostCheck:
    def __init__(self, app: ASGIApp, allowed: list[str]) -> None:
        self.app = app
        self.allowed = frozenset(allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if host_of(header) not in self.allowed:
                await send_problem(
                    send,
                    400,
                    f"Host: {header!r} is not a name this server answers to "
                    f"({', '.join(sorted(self.allowed))}; DDPO_ALLOWED_HOSTS adds names)",
                )
                return
        await self.app(scope, receive, send)


READS = frozenset({"GET", "HEAD", "OPTIONS"})


class OriginCheck:
    def __init__(self, app: ASGIApp, origins: list[str]) -> None:
        self.app = app
        self.origins = frozenset(o.rstrip("/").lower() for o in origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in READS:
            headers = dict(scope["headers"])
            origin = headers.get(b"origin", b"").decode("latin-1").rstrip("/").lower()
            host = headers.get(b"host", b"").decode("latin-1").lower()
            own = {f"http://{host}", f"https://{host}"}
            if origin and origin not in own and origin not in self.origins:
                await send_problem(
                    send,
                    403,
                    f"Origin: pages of {origin!r} may not change anything here "
                    "(DDPO_CORS_ORIGINS names the origins that may)",
                )
                return
        await self.app(scope, receive, send)
