"""The settings page in a real browser: headless Chromium from the system packages, driven by
Playwright (no browser download), against a real bridge on 127.0.0.1. A user enters the token
once, adds a local-wiki source, tests it, asks a question, chooses a runtime and asks again; a
screenshot of the page is saved as the test's artifact and its path printed."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.cli import build_app
from bridge.config import BridgeConfig
from compat.settings import convert
from tests.knowledge.conftest import WIKI
from tests.knowledge.servers import FakeRuntime, ThreadedServer

pytestmark = pytest.mark.timeout(120)

TOKEN = "ops-browser-token-123"
KEY = "sk-browser-secret-0123456789"
QUESTION = "What approval do refunds over 500 USD need?"
WAIT_MS = 20_000


def chromium() -> str:
    """The system Chromium (``make browser`` installs it; ``XWORKMATE_CHROMIUM`` names another)."""
    for name in (os.environ.get("XWORKMATE_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and (path := shutil.which(name)):
            return path
    pytest.fail("no chromium found: run `make test` (it runs scripts/install-chromium.sh)")


@pytest.fixture
def bridge_url(tmp_path: Path) -> Iterator[str]:
    shutil.copytree(WIKI, tmp_path / "ws" / "wiki")
    raw = {
        "workspaceRoots": [str(tmp_path / "ws")],
        "stateDir": str(tmp_path / "state"),
        "providers": {"knowledge": {"type": "knowledge"}},
        "authTokens": [{"name": "ops", "token": TOKEN}],
        "adminPrincipals": ["ops"],
    }
    with ThreadedServer(build_app(convert(raw, BridgeConfig)), lifespan="on") as server:
        yield server.url


@pytest.fixture
def fake_runtime() -> Iterator[tuple[FakeRuntime, str]]:
    fake = FakeRuntime()
    with ThreadedServer(fake.app()) as server:
        yield fake, server.url + "/v1"


def test_a_user_adds_a_local_wiki_source_and_asks_a_question_in_a_real_browser(
    bridge_url: str, fake_runtime: tuple[FakeRuntime, str], tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    fake, runtime_url = fake_runtime
    expect.set_options(timeout=WAIT_MS)
    shot = tmp_path / "settings-page.png"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), headless=True)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.set_default_timeout(WAIT_MS)
            page.goto(bridge_url + "/settings")
            expect(page.locator("#token-status")).to_contain_text("missing or invalid")  # no token yet

            page.fill("#token", TOKEN)
            page.click("#token-form button[type=submit]")
            expect(page.locator("#token-status")).to_have_text("Token kept for this tab.")
            expect(page.locator("#runtime-current")).to_contain_text("No runtime")

            page.fill("#add-id", "acme")
            page.fill("#add-label", "Acme ops wiki")
            page.select_option("#add-protocol", "local-wiki")
            page.fill("#add-location", str(tmp_path / "ws" / "wiki"))
            page.click("#add-form button[type=submit]")
            expect(page.locator("#add-status")).to_have_text("Added acme: ready.")
            row = page.locator('#sources tr[data-source-id="acme"]')
            expect(row.locator(".source-status")).to_have_text("registered")

            page.click("#test-sources")
            expect(row.locator(".source-status")).to_contain_text("ready")

            page.fill("#question", QUESTION)
            page.click("#ask-form button[type=submit]")
            expect(page.locator("#ask-status")).to_have_text("completed · evidence-only")
            expect(page.locator("#citations li").filter(has_text="(acme: /").first).to_be_visible()
            assert "](#citation-" not in page.inner_text("#answer")

            page.fill("#runtime-url", runtime_url)
            page.fill("#runtime-model", "mock-model")
            page.fill("#runtime-key", KEY)
            page.click("#runtime-form button[type=submit]")
            expect(page.locator("#runtime-status")).to_have_text("Runtime saved.")
            expect(page.locator("#runtime-current")).to_contain_text("an API key is stored on the bridge")
            assert page.input_value("#runtime-key") == ""

            page.reload()  # the token is kept in the tab's session storage: not asked again
            expect(page.locator("#token-status")).to_have_text("Token kept for this tab.")
            expect(row.locator(".source-status")).to_have_text("registered")
            page.fill("#question", QUESTION)
            page.click("#ask-form button[type=submit]")
            expect(page.locator("#ask-status")).to_have_text("completed · hybrid")
            expect(page.locator("#answer")).to_contain_text("finance lead approval [1].")
            expect(page.locator("#citations li").filter(has_text="(acme: /").first).to_be_visible()
            assert KEY not in page.content()
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert fake.headers[-1]["authorization"] == f"Bearer {KEY}"  # the key went only to the runtime
    assert shot.stat().st_size > 10_000
    print(f"\nsettings page screenshot: {shot}")
