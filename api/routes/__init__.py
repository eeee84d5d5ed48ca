"""One router per resource, mounted in api/main.py; every route declared
with :func:`endpoint` from its row of api/route_table.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter

from api.route_table import Route
from api.routes.off_loop import OffLoopBody

F = TypeVar("F", bound=Callable[..., Any])


def endpoint(router: APIRouter, route: Route, **options: Any) -> Callable[[F], F]:
    """``router``'s decorator for this route (its path less the router's
    prefix); a route that takes large bodies decodes them off the event loop."""
    assert route.path.startswith(router.prefix), (route.path, router.prefix)

    def decorate(func: F) -> F:
        router.add_api_route(
            route.path.removeprefix(router.prefix),
            func,
            methods=[route.method],
            route_class_override=OffLoopBody if route.large_body else None,
            **options,
        )
        return func

    return decorate
