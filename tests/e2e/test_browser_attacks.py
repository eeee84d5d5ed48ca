"""A page of another origin, open in the user's Chromium, against a server
on loopback started with no tokens configured (it makes its own), or told
to check none (DDPO_NO_AUTH): it cannot cancel, revoke or submit. And the
link ``ddpo dashboard`` prints opens the dashboard with the made token."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.cluster import LocalCluster, free_port
from tests.e2e.browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, needs_a_browser
from tests.e2e.conftest import ddpo_told_no_token

sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = needs_a_browser  # skipped, or failed in CI, without a Chromium

ATTACK = """<!doctype html><html><body>
<iframe name="sink"></iframe>
<form id="cancel" method="POST" action="{server}/jobs/{job}/cancel" target="sink"></form>
<script>
document.getElementById("cancel").submit();
Promise.allSettled([
  fetch("{server}/nodes/{node}/revoke", {{method: "POST", mode: "no-cors"}}),
  fetch("{server}/jobs", {{method: "POST", mode: "no-cors",
    headers: {{"content-type": "text/plain"}}, body: '{{"epochs": 1}}'}}),
  fetch("{server}/jobs/{job}/cancel", {{method: "POST", mode: "no-cors"}}),
]).then(() => setTimeout(() => {{ document.title = "done"; }}, 500));
</script></body></html>"""


@pytest.fixture(params=["tokens it made", "no auth"])
def open_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalCluster]:
    """A server started with no tokens: it makes them, or is told to check none."""
    cluster = LocalCluster(
        state_dir=tmp_path / "cluster",
        data_dir=tmp_path,
        workers=0,
        secure=request.param != "no auth",
        server_makes_tokens=request.param != "no auth",
        extra_env={"XDG_RUNTIME_DIR": str(tmp_path / "runtime")},
        # The node the test registers never heartbeats: the question is
        # whether the page revoked it, not whether it fell silent while a
        # browser started on a busy machine (CI saw "lost" past 6 s).
        server_env={"DDPO_HEARTBEAT_TIMEOUT_S": "600"},
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def elsewhere(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """Another origin: a plain web server on another port, serving a folder."""
    folder = tmp_path / "site"
    folder.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(folder), **kwargs)

        def log_message(self, *_: Any) -> None:
            pass

    site = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Quiet)
    thread = threading.Thread(target=site.serve_forever, daemon=True)
    thread.start()
    try:
        yield folder, f"http://127.0.0.1:{site.server_address[1]}"
    finally:
        site.shutdown()
        site.server_close()


def test_a_page_of_another_origin_cannot_cancel_revoke_or_submit(
    open_server: LocalCluster, elsewhere: tuple[Path, str]
) -> None:
    folder, origin = elsewhere
    join = {"Authorization": f"Bearer {open_server.tokens.join}"} if open_server.tokens else {}
    with httpx.Client(
        base_url=open_server.url, timeout=10, headers=open_server.headers("admin")
    ) as client:
        # Two machines: it waits, queued, beside the one node registered here.
        two = {"topology": {"num_machines": 2, "num_processes": 1}}
        job = client.post("/jobs", json=two).raise_for_status().json()["id"]
        node = (
            client.post(
                "/nodes/register",
                json={"name": "victim", "address": "127.0.0.1"},
                headers=join,
            )
            .raise_for_status()
            .json()["node_id"]
        )
        (folder / "attack.html").write_text(
            ATTACK.format(server=open_server.url, job=job, node=node)
        )
        with sync_api.sync_playwright() as playwright:
            assert CHROMIUM is not None, "no chromium on PATH"
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                tab = browser.new_page()
                tab.goto(f"{origin}/attack.html")
                tab.wait_for_function("document.title === 'done'", timeout=20_000)
            finally:
                browser.close()
        assert client.get(f"/jobs/{job}").json()["status"] == "queued"
        assert [n["state"] for n in client.get("/nodes").json()["data"]] == ["live"]
        assert client.get("/jobs").json()["count"] == 1


def test_the_dashboard_link_and_the_api_reference_work_on_a_server_that_made_its_tokens(
    tmp_path: Path,
) -> None:
    runtime = tmp_path / "runtime"
    with LocalCluster(
        state_dir=tmp_path / "cluster",
        data_dir=tmp_path,
        workers=0,
        server_makes_tokens=True,
        extra_env={"XDG_RUNTIME_DIR": str(runtime)},
    ) as cluster:
        assert httpx.get(f"{cluster.url}/jobs").status_code == 401
        httpx.post(
            f"{cluster.url}/jobs", json={"name": "seen"}, headers=cluster.headers("admin")
        ).raise_for_status()
        shown = ddpo_told_no_token(cluster.url, runtime, "dashboard")
        assert shown.returncode == 0, shown.stderr
        link = shown.stdout.strip()
        assert link.startswith(f"{cluster.url}/ui#token=")
        with sync_api.sync_playwright() as playwright:
            assert CHROMIUM is not None, "no chromium on PATH"
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                tab = browser.new_page()
                tab.goto(link)
                tab.get_by_text("seen").first.wait_for(timeout=20_000)
                assert "token" not in tab.url  # dropped from the address once kept
                tab.screenshot(path=str(ARTIFACTS / "dashboard-made-token.png"), full_page=True)
                # The API reference: Swagger UI from this server's own files, offline.
                elsewhere: list[str] = []
                tab.on(
                    "request",
                    lambda r: None if r.url.startswith(cluster.url) else elsewhere.append(r.url),
                )
                tab.goto(f"{cluster.url}/docs")
                tab.locator(".opblock").first.wait_for(timeout=20_000)
                assert tab.locator(".opblock").count() > 20
                assert tab.locator(".authorize").count() >= 1  # it can send a token
                assert elsewhere == []
                tab.screenshot(path=str(ARTIFACTS / "api-reference.png"), full_page=False)
            finally:
                browser.close()
