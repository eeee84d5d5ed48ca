"""The web dashboard, served by the API server itself: one HTML shell, a
script and a stylesheet from ``api/dashboard/``, and plotly's chart library
from the installed ``plotly`` package. The pages read the same JSON API as
everyone else; nothing here reaches the database."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, RedirectResponse, Response

from api import route_table
from api.routes import endpoint

ASSETS = Path(__file__).resolve().parent.parent / "dashboard"
STATIC = {
    "app.js": "text/javascript",
    "app.css": "text/css",
}

router = APIRouter(include_in_schema=False)

# The pages keep a token in the browser's storage: they load nothing from
# elsewhere, may not be framed, and their files are what they say they are.
# Inline style attributes stay allowed (the app's markup and plotly use
# them), and so does eval: the plotly bundle the python package ships
# compiles functions from strings. Inline and foreign scripts stay blocked.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-eval'; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


def _plotly_js() -> Path:
    import plotly

    return Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


def _one_origin(request: Request) -> RedirectResponse | None:
    """A page asked for as ``localhost`` goes to the address it was served
    on (``127.0.0.1``, what ``ddpo dashboard`` prints): a browser keeps the
    token per origin, so one host under two names would ask for it twice.
    The ``#token=`` of a link survives the redirect (browsers keep it)."""
    name = (request.url.hostname or "").lower()
    served_on = (request.scope.get("server") or (None, None))[0]
    if name != "localhost" or not served_on or not str(served_on).startswith("127."):
        return None
    port = f":{request.url.port}" if request.url.port else ""
    query = f"?{request.url.query}" if request.url.query else ""
    return RedirectResponse(f"{request.url.scheme}://{served_on}{port}{request.url.path}{query}")


@endpoint(router, route_table.DASHBOARD_ROOT)
def root(request: Request) -> RedirectResponse:
    return _one_origin(request) or RedirectResponse("/ui/jobs")


@endpoint(router, route_table.DASHBOARD_STATIC)
def static(name: str) -> FileResponse:
    if name == "plotly.min.js":
        return FileResponse(_plotly_js(), media_type="text/javascript", headers=PAGE_HEADERS)
    if name not in STATIC:
        raise HTTPException(404, f"no dashboard file {name!r}")
    return FileResponse(ASSETS / name, media_type=STATIC[name], headers=PAGE_HEADERS)


@endpoint(router, route_table.DASHBOARD)
@endpoint(router, route_table.DASHBOARD_PAGE)
def page(request: Request, page: str = "jobs") -> Response:
    """Every page is the same shell; its script renders what the path names
    (jobs, jobs/<id>, submit, nodes)."""
    moved = _one_origin(request)
    if moved is not None:
        return moved
    return FileResponse(ASSETS / "index.html", media_type="text/html", headers=PAGE_HEADERS)
