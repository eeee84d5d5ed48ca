"""One router per resource, mounted in api/main.py; every route declared
with :func:`endpoint` from its row of api/route_table.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter

from api.route_table import Route

F = TypeVar("F", bound=Callable[..., Any])


def endpoint(router: APIRouter, route: Route, **options: Any) -> Callable[[F], F]:
    """``router``'s decorator for this route (its path less the router's prefix)."""
    assert route.path.startswith(router.prefix), (route.path, router.prefix)
    decorate: Callable[[F], F] = router.api_route(
        route.path.removeprefix(router.prefix), methods=[route.method], **options
    )
    return decorate
