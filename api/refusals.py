"""The domain's refusals (api/core/errors.py) and a refused status change
as HTTP answers: one shape for the routes' exception handlers (api/main.py)
and for the lane that answers a node's requests before routing
(api/node_lane.py)."""

from __future__ import annotations

import math

from fastapi.responses import JSONResponse

from api.core.errors import DomainError, InvalidFields
from ddpo.lifecycle import IllegalTransition


def refusal(exc: DomainError | IllegalTransition) -> JSONResponse:
    """``exc`` answered with its status; a field's refusal names the field."""
    if isinstance(exc, IllegalTransition):
        return JSONResponse(status_code=409, content={"detail": str(exc)})
    if isinstance(exc, InvalidFields):
        detail = [
            {
                "type": "value_error",
                "loc": ["body", *loc],
                "msg": text(f"{'.'.join(str(part) for part in loc)}: {msg}"),
            }
            for loc, msg in exc.errors
        ]
        return JSONResponse(status_code=exc.status, content={"detail": detail})
    wait_s = getattr(exc, "retry_after_s", None)
    headers = {"Retry-After": str(max(1, math.ceil(wait_s)))} if wait_s is not None else None
    return JSONResponse(status_code=exc.status, content={"detail": str(exc)}, headers=headers)


def text(value: object) -> str:
    """``value`` as a string any JSON encoder takes (lone surrogates escaped)."""
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")
