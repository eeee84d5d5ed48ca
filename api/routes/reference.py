"""The API reference: Swagger UI at ``/docs`` (it sends the bearer token the
OpenAPI document declares: its "Authorize" button) and ReDoc at ``/redoc``,
their files served from the installed ``fastapi-offline`` package rather
than a CDN, so they work offline and the pages load nothing from elsewhere."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import FileResponse, HTMLResponse

from api import route_table
from api.routes import endpoint

router = APIRouter(include_in_schema=False)

FILES = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}
HEADERS = {"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY"}


def _assets() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).resolve().parent / "static"


@endpoint(router, route_table.DOCS)
def docs() -> HTMLResponse:
    page = get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="ddpo API",
        oauth2_redirect_url=route_table.DOCS_OAUTH.path,
        swagger_js_url="/docs/static/swagger-ui-bundle.js",
        swagger_css_url="/docs/static/swagger-ui.css",
        swagger_favicon_url="/docs/static/favicon.png",
        swagger_ui_parameters={"persistAuthorization": False},
    )
    page.headers.update(HEADERS)
    return page


@endpoint(router, route_table.DOCS_OAUTH)
def oauth2_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@endpoint(router, route_table.DOCS_STATIC)
def docs_file(name: str) -> FileResponse:
    if name not in FILES:
        raise HTTPException(404, f"no API reference file {name!r}")
    return FileResponse(_assets() / name, media_type=FILES[name], headers=HEADERS)


@endpoint(router, route_table.REDOC)
def redoc() -> HTMLResponse:
    page = get_redoc_html(
        openapi_url="/openapi.json",
        title="ddpo API",
        redoc_js_url="/docs/static/redoc.standalone.js",
        redoc_favicon_url="/docs/static/favicon.png",
        with_google_fonts=False,
    )
    page.headers.update(HEADERS)
    return page
