"""The domain's refusals. Raised below the HTTP layer (by commands that a
background tick may call as well as a route); api/main.py answers each
with its status and the message as ``detail``."""

from __future__ import annotations


class DomainError(Exception):
    """A request the server refuses, with a message that names what to fix."""

    status = 400


class NotFound(DomainError):
    status = 404


class Forbidden(DomainError):
    """Allowed to the caller's role, but not on this thing (another node's part)."""

    status = 403


class Conflict(DomainError):
    """Not possible in the thing's current state."""

    status = 409


class TooLarge(DomainError):
    """More bytes than a cap or a quota allows."""

    status = 413


class TooMany(DomainError):
    """Too many at once: try again after ``retry_after_s``."""

    status = 429

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unavailable(DomainError):
    """Something the server depends on (the artifact store) cannot be used
    now: the request may succeed later."""

    status = 503


class InvalidFields(DomainError):
    """Fields of a request that are well-formed but that this cluster cannot
    take (parameters its trainer's schema refuses): answered like a schema's
    422, each message starting with the field's dotted name."""

    status = 422

    def __init__(self, errors: list[tuple[list[str | int], str]]) -> None:
        super().__init__("; ".join(f"{_dotted(loc)}: {msg}" for loc, msg in errors))
        self.errors = errors


def _dotted(loc: list[str | int]) -> str:
    return ".".join(str(part) for part in loc)
