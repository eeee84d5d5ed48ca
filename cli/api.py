"""The CLI's one way to talk to the server: every answer that is not a
success becomes a :class:`CliError` whose message says what went wrong and
what to do (which variable to set, which role is needed), and ``ddpo``
prints it as one line and exits non-zero. No command shows a traceback.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx

from ddpo import kept, local_tokens

DEFAULT_SERVER = "http://127.0.0.1:8000"
T = TypeVar("T")


class CliError(Exception):
    """A failure the user can act on; its message is the whole story."""


class Unreachable(CliError):
    """No answer from the server (down, restarting, wrong address)."""


class ServerFailed(CliError):
    """The server answered 5xx: worth trying again."""


def server_url(given: str | None) -> str:
    """``--server``, else ``$DDPO_SERVER``, else the cluster ``ddpo
    local-cluster --keep`` keeps here, else the default; a missing scheme is
    taken as http (``127.0.0.1:8000``)."""
    found = given or os.environ.get("DDPO_SERVER")
    if not found:
        here = kept.read()
        found = here.server if here is not None else DEFAULT_SERVER
    url = found.strip().rstrip("/")
    if "://" not in url:
        url = f"http://{url}"
    if urlsplit(url).scheme not in ("http", "https"):
        raise CliError(f"--server: {url!r} is not an http:// or https:// URL")
    return url


def token_for(url: str) -> str | None:
    """``$DDPO_TOKEN``, else the user token of the kept cluster at ``url``,
    else the admin token a server on this host made for itself."""
    if os.environ.get("DDPO_TOKEN"):
        return os.environ["DDPO_TOKEN"]
    here = kept.read()
    if here is not None and here.server == url:
        return here.token
    made = local_tokens.tokens_for(url)
    return made.admin if made is not None else None


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:300] or response.reason_phrase
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list):  # validation errors: each names its field
        return "; ".join(str(d.get("msg", d)) for d in detail if isinstance(d, dict))
    return str(detail) if detail is not None else str(body)[:300]


def problem(response: httpx.Response, doing: str) -> CliError:
    """What a failed answer means to the person at the terminal."""
    status, detail = response.status_code, _detail(response)
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
    """An httpx client of the server whose failures are :class:`CliError`."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 30) -> None:
        self.url = url
        self.http = httpx.Client(
            base_url=url,
            timeout=timeout_s,
            headers={"Authorization": f"Bearer {token}"} if token else None,
        )

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def unreachable(self, exc: Exception) -> Unreachable:
        return Unreachable(
            f"cannot reach the server at {self.url} ({type(exc).__name__}: {exc}); is it "
            "running, and is --server (or DDPO_SERVER) its address?"
        )

    def request(
        self, method: str, path: str, doing: str, *, ok: tuple[int, ...] = (), **kwargs: Any
    ) -> httpx.Response:
        """The response, if it succeeded (2xx, or a status in ``ok``)."""
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise self.unreachable(exc) from None
        if response.is_success or response.status_code in ok:
            return response
        raise problem(response, doing)

    def get(self, path: str, doing: str, **params: Any) -> Any:
        clean = {k: v for k, v in params.items() if v is not None}
        return self.request("GET", path, doing, params=clean).json()

    def post(self, path: str, doing: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, doing, **kwargs)

    @contextmanager
    def stream(self, path: str, doing: str, **params: Any) -> Iterator[httpx.Response]:
        clean = {k: v for k, v in params.items() if v is not None}
        try:
            with self.http.stream(
                "GET", path, params=clean, timeout=httpx.Timeout(30, read=None)
            ) as response:
                if not response.is_success:
                    response.read()
                    raise problem(response, doing)
                yield response
        except httpx.HTTPError as exc:
            raise self.unreachable(exc) from None


def riding_out_restarts(
    attempt: Callable[[], T],
    *,
    say: Callable[[str], None],
    pause_s: float = 1.0,
    max_pause_s: float = 5.0,
) -> T:
    """``attempt()`` again, with a growing pause, while the server is away or
    failing (a restart, a deploy): the job runs on without it. Says so once,
    and once more when the server is back. Other errors pass through."""
    away_since = None
    while True:
        try:
            value = attempt()
        except (Unreachable, ServerFailed) as exc:
            reason = str(exc)
        else:
            if away_since is not None:
                say(f"the server is back after {time.monotonic() - away_since:.0f} s")
            return value
        if away_since is None:
            away_since = time.monotonic()
            say(f"{reason}; retrying until it answers (Ctrl-C to stop watching)")
        time.sleep(pause_s)
        pause_s = min(pause_s * 2, max_pause_s)
