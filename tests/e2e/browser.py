"""A real headless Chromium for the dashboard's tests: the ``page``
fixture (a laptop-sized tab that fails the test on any script error or
blocked content) and signing in."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from cli.cluster import LocalCluster
from tests.conftest import REPO

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# CI sets DDPO_REQUIRE_BROWSER: there a missing browser fails, never skips.
needs_a_browser = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("DDPO_REQUIRE_BROWSER"),
    reason="needs a Chromium: apt-get install chromium (.ci/run does)",
)
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def page() -> Iterator[Any]:
    ARTIFACTS.mkdir(exist_ok=True)
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        assert CHROMIUM is not None, "no chromium on PATH"
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        # A laptop screen.
        tab = browser.new_page(viewport={"width": 1366, "height": 768})
        errors: list[str] = []
        tab.on("pageerror", lambda error: errors.append(str(error)))
        # What the page's Content-Security-Policy blocked, if anything.
        tab.on(
            "console",
            lambda message: (
                errors.append(message.text) if "Content Security Policy" in message.text else None
            ),
        )
        try:
            yield tab
        finally:
            browser.close()
        assert errors == [], f"script errors or blocked content on the page: {errors}"


def badge(page: Any) -> str:
    text: str = page.locator("#status .badge").inner_text()
    return text


def sign_in(page: Any, cluster: LocalCluster, token: str) -> None:
    """Answer the dashboard's one question: the token, kept by the browser."""
    page.fill("#token-form input[name=token]", token)
    page.click("#token-form button[type=submit]")
    page.wait_for_load_state()
