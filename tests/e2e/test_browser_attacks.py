"""A page of another origin, open in the user's Chromium, against a server
on loopback that checks no tokens: it cannot cancel, revoke or submit."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.cluster import LocalCluster, free_port
from tests.e2e import test_dashboard
from tests.e2e.test_dashboard import CHROMIUM, CHROMIUM_ARGS, sync_api

pytestmark = test_dashboard.pytestmark  # skipped, or failed in CI, without a Chromium

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


@pytest.fixture
def open_server(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(
        state_dir=tmp_path / "cluster", data_dir=tmp_path, workers=0, secure=False
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
    with httpx.Client(base_url=open_server.url, timeout=10) as client:
        # Two machines: it waits, queued, beside the one node registered here.
        two = {"topology": {"num_machines": 2, "num_processes": 1}}
        job = client.post("/jobs", json=two).raise_for_status().json()["id"]
        node = (
            client.post("/nodes/register", json={"name": "victim", "address": "127.0.0.1"})
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
