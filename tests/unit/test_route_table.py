"""The route table is the one list of routes: the app serves exactly its
rows, and the auth and body-cap decisions come from them."""

from __future__ import annotations

from pathlib import Path

from api import route_table
from api.main import create_app
from api.routes import dashboard, reference
from api.settings import ServerSettings


def served(tmp_path: Path) -> set[tuple[str, str]]:
    """What the app serves: its OpenAPI document's routes, the ones FastAPI
    adds itself, the dashboard's and the API reference's (kept out of the document)."""
    app = create_app(ServerSettings(database_url=f"sqlite:///{tmp_path / 'r.db'}"))
    found = {
        (method.upper(), path)
        for path, operations in app.openapi()["paths"].items()
        for method in operations
    }
    for route in [*app.routes, *dashboard.router.routes, *reference.router.routes]:
        for method in getattr(route, "methods", None) or ():
            if method != "HEAD":
                found.add((method, route.path))
    return found


def test_the_app_serves_exactly_the_tables_routes(tmp_path: Path) -> None:
    table = {(r.method, r.path) for r in route_table.ROUTES}
    assert served(tmp_path) == table
    assert len(table) == len(route_table.ROUTES)  # no row twice


def test_requests_match_their_route_literal_paths_first() -> None:
    assert route_table.match("POST", "/nodes/register") is route_table.REGISTER_NODE
    assert route_table.match("POST", "/nodes/3/poll") is route_table.POLL
    assert route_table.match("HEAD", "/jobs/3") is route_table.GET_JOB
    assert route_table.match("GET", "/ui/jobs/3") is route_table.DASHBOARD_PAGE
    assert route_table.match("DELETE", "/jobs/3") == 405
    assert route_table.match("GET", "/nowhere") == 404
    uploads = [r for r in route_table.ROUTES if r.upload]
    assert uploads == [route_table.PART_CHECKPOINT]


def test_a_path_matches_the_same_route_asked_again_or_past_the_cached_length() -> None:
    """Matches are kept per path: asked again, or for paths too long to keep
    (a client's made-up ones), the answer is the one a fresh match gives,
    and a 404 or 405 stays one."""
    long_id = "9" * (route_table._CACHED_PATH_CHARS + 1)
    asked = [
        ("GET", "/jobs/3"),
        ("HEAD", "/jobs/3"),
        ("DELETE", "/jobs/3"),
        ("POST", "/nodes/register"),
        ("GET", "/nowhere"),
        ("GET", f"/jobs/{long_id}"),
        ("PUT", f"/jobs/{long_id}"),
        ("GET", f"/{long_id}"),
    ]
    for method, path in asked * 2:
        assert route_table.match(method, path) == route_table._match(method, path), (method, path)
    assert route_table.match("GET", f"/jobs/{long_id}") is route_table.GET_JOB
    assert route_table.match("PUT", f"/jobs/{long_id}") == 405
    assert route_table.match("GET", f"/{long_id}") == 404
