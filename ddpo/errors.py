"""What the client raises: one class per thing a script does something
different about, each carrying the server's own words.

    try:
        job = client.wait(client.submit(epochs=1))
    except ddpo.JobFailed as failed:
        print(failed.reason, failed.job.error.message)
    except ddpo.Invalid as bad:
        print(bad.fields)            # ["topology.num_machines"]
    except ddpo.Unavailable:
        ...                          # the server is away: try again later

Pure: no I/O, nothing but the standard library and the wire types.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ddpo.failures import FailureReason
from ddpo.lifecycle import JobStatus
from ddpo.schemas.public import JobPublic
from ddpo.schemas.sweep import SweepPublic


class DdpoError(Exception):
    """Anything the client raises on purpose."""


class ApiError(DdpoError):
    """The server refused or failed a request. ``status`` is the HTTP status
    (0: no answer at all); ``detail`` the server's words."""

    status: int = 0

    def __init__(self, detail: str, *, status: int | None = None, body: Any = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if status is not None:
            self.status = status
        self.body = body


class Unauthorized(ApiError):
    """401: no token, or one the server does not accept."""

    status = 401


class Forbidden(ApiError):
    """403: the token's role may not do this, or the job is someone else's."""

    status = 403


class NotFound(ApiError):
    """404: no such job, node, study or key."""

    status = 404


class Conflict(ApiError):
    """409: not in its current state (a started job's priority, a name taken)."""

    status = 409


class TooLarge(ApiError):
    """413: a body over the server's cap."""

    status = 413


class Invalid(ApiError):
    """400 or 422: the request names something wrong. ``fields`` are the
    dotted names of the offending fields (``topology.num_machines``), in the
    server's order; ``errors`` the server's entries, one per problem."""

    status = 422

    def __init__(
        self,
        detail: str,
        *,
        status: int | None = None,
        body: Any = None,
        errors: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(detail, status=status, body=body)
        self.errors = errors or []
        self.fields = _fields(self.errors, detail)


class Unavailable(ApiError):
    """No answer worth keeping: the server is down or restarting (status 0),
    overloaded (429, 503: ``retry_after`` seconds if it said), or a proxy in
    front of it failed (502, 504). Worth trying again."""

    def __init__(
        self,
        detail: str,
        *,
        status: int | None = None,
        body: Any = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(detail, status=status, body=body)
        self.retry_after = retry_after


class ServerError(ApiError):
    """500 and other 5xx: the server failed; its log says why."""

    status = 500


class JobFailed(DdpoError):
    """``wait`` on a job that ended without succeeding (failed or cancelled).
    ``reason`` is the failure's (``FailureReason``), or ``cancelled``."""

    def __init__(self, job: JobPublic) -> None:
        self.job = job
        self.status: JobStatus = job.status
        error = job.error
        self.reason: FailureReason | str = error.reason if error is not None else str(job.status)
        said = f": {error.message}" if error is not None and error.message else ""
        super().__init__(f"job {job.id} {job.status} ({self.reason}){said}")


class WaitTimeout(DdpoError, TimeoutError):
    """``wait`` gave up before the job ended; ``job`` is as last seen (for
    ``wait_sweep``, the sweep)."""

    def __init__(self, job: JobPublic | SweepPublic, timeout_s: float) -> None:
        self.job = job
        what = "job" if isinstance(job, JobPublic) else "sweep"
        super().__init__(f"{what} {job.id} still {job.status} after {timeout_s:g} s")


_BY_STATUS: dict[int, type[ApiError]] = {
    400: Invalid,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    422: Invalid,
}
UNAVAILABLE_STATUSES = frozenset({429, 502, 503, 504})


def error_for(status: int, text: str, headers: Mapping[str, str]) -> ApiError:
    """The typed error for a failed answer (status >= 400)."""
    try:
        body: Any = json.loads(text) if text else None
    except ValueError:
        body = None
    detail = body.get("detail") if isinstance(body, dict) else None
    entries = [d for d in detail if isinstance(d, dict)] if isinstance(detail, list) else []
    if entries:
        words = "; ".join(str(d.get("msg", d)) for d in entries)
    elif detail is not None:
        words = str(detail)
    else:
        words = text.strip()[:300] or f"HTTP {status}"
    if status in UNAVAILABLE_STATUSES:
        return Unavailable(words, status=status, body=body, retry_after=_seconds(headers))
    kind = _BY_STATUS.get(status)
    if kind is Invalid:
        return Invalid(words, status=status, body=body, errors=entries)
    if kind is not None:
        return kind(words, status=status, body=body)
    if status >= 500:
        return ServerError(words, status=status, body=body)
    return ApiError(words, status=status, body=body)


def _seconds(headers: Mapping[str, str]) -> float | None:
    try:
        return float(headers.get("retry-after", ""))
    except ValueError:
        return None


# The server starts each message with the dotted field it is about
# ("topology.num_machines: ..."), in a validation list and in a plain detail.
_FIELD = re.compile(r"^([A-Za-z_][\w]*(?:\.[\w-]+)*):\s")


def _fields(entries: list[dict[str, Any]], detail: str) -> list[str]:
    found: list[str] = []
    for entry in entries:
        loc = [str(part) for part in entry.get("loc", ())]
        if loc and loc[0] in ("body", "query", "path", "header", "cookie"):
            loc = loc[1:]
        name = ".".join(loc)
        if not name:
            match = _FIELD.match(str(entry.get("msg", "")))
            name = match.group(1) if match else ""
        if name and name not in found:
            found.append(name)
    if not entries:
        for piece in detail.split("; "):
            match = _FIELD.match(piece)
            if match and match.group(1) not in found:
                found.append(match.group(1))
    return found
