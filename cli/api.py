"""The CLI's one way to talk to the server: every answer that is not a
success becomes a :class:`CliError` whose message says what went wrong and
what to do (which variable to set, which role is needed), and ``ddpo``
prints it as one line and exits non-zero. No command shows a traceback.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import httpx

from ddpo import client as ddpo_client
from ddpo.errors import ApiError, Unavailable

DEFAULT_SERVER = ddpo_client.DEFAULT_SERVER
T = TypeVar("T")


class CliError(Exception):
    """A failure the user can act on; its message is the whole story."""


class Unreachable(CliError):
    """No answer from the server (down, restarting, wrong address)."""


class ServerFailed(CliError):
    """The server answered 5xx: worth trying again."""


def server_url(given: str | None) -> str:
    """``--server``, else ``$DDPO_SERVER``, else the kept cluster's, else
    the default (ddpo/client.py decides, for the client and the CLI alike)."""
    try:
        return ddpo_client.server_url(given)
    except ValueError as exc:
        raise CliError(f"--{exc}") from None


token_for = ddpo_client.token_for


def problem(error: ApiError, doing: str) -> CliError:
    """What a failed answer means to the person at the terminal."""
    status, detail = error.status, error.detail
    if isinstance(error, Unavailable) and status == 0:
        return Unreachable(detail)
    if status == 401:
        set_what = (
            "set DDPO_TOKEN to a token the server accepts (a user token, the server's "
            "DDPO_USER_TOKEN, to submit and cancel; a read token, DDPO_READ_TOKEN, to look)"
            if not os.environ.get("DDPO_TOKEN")
            else "DDPO_TOKEN is not a token this server accepts; check it against the "
            "server's DDPO_USER_TOKEN"
        )
        return CliError(f"{doing}: the server wants a token: {set_what}")
    if status == 403 and "role may not" in detail:
        # Refused for the role, not for whose job it is: say which token helps.
        return CliError(
            f"{doing}: {detail}; put a key or token whose role may in DDPO_TOKEN (a user's to "
            "submit and steer their own jobs, an admin's for keys, the audit log and others' jobs)"
        )
    if status >= 500:
        return ServerFailed(f"{doing}: the server failed ({status}): {detail}")
    return CliError(f"{doing}: {detail}")


class Api:
    """The CLI's view of :class:`ddpo.Client`: the same requests, with each
    failure turned into a :class:`CliError` that says what ``doing`` was."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 30) -> None:
        self.url = url
        # An empty token: none (the client would look one up again).
        self.client = ddpo_client.Client(url, token or "", timeout_s=timeout_s)

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    @contextmanager
    def doing(self, what: str) -> Iterator[ddpo_client.Client]:
        """The client, whose typed errors become CliErrors about ``what``."""
        try:
            yield self.client
        except ApiError as error:
            raise problem(error, what) from None

    def request(
        self, method: str, path: str, doing: str, *, ok: tuple[int, ...] = (), **kwargs: Any
    ) -> httpx.Response:
        """The response, if it succeeded (2xx, or a status in ``ok``)."""
        with self.doing(doing) as client:
            return client.request(method, path, ok=ok, **kwargs)

    def get(self, path: str, doing: str, **params: Any) -> Any:
        clean = {k: v for k, v in params.items() if v is not None}
        return self.request("GET", path, doing, params=clean).json()

    def post(self, path: str, doing: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, doing, **kwargs)


def riding_out_restarts(attempt: Callable[[], T], *, say: Callable[[str], None]) -> T:
    """``attempt()`` again, with a growing pause, while the server is away or
    failing (a restart, a deploy): the job runs on without it. Says so once,
    and once more when the server is back (the client's own patience, with
    no limit: Ctrl-C stops it). Other errors pass through."""
    patience = ddpo_client.Patience(math.inf, say)
    while True:
        try:
            value = attempt()
        except (Unreachable, ServerFailed) as exc:
            time.sleep(patience.missed(Unavailable(str(exc))))
            continue
        patience.answered()
        return value
