"""Debian's Chromium for the portal's tests, driven by Playwright's Python API (``executable_path``:
never a browser of Playwright's own), and what a page says on its console."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright

AXE_CORE_VERSION = "4.11.0"
AXE = Path.home() / f".cache/llmgw/axe-core-{AXE_CORE_VERSION}/node_modules/axe-core/axe.min.js"


@contextmanager
def debian_chromium() -> Iterator[Browser]:
    """Headless Chromium, closed on the way out. Start it after any cluster: Playwright's sync API
    holds an event loop in this thread, and a cluster's setup runs one of its own."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("Debian's chromium is not installed: run 'make chromium' (apt-get install chromium)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


class Console:
    """What the page said on its console, errors apart; a page error (an uncaught exception) is one."""

    def __init__(self, page: Page) -> None:
        self.errors: list[str] = []
        page.on("console", self.heard)
        page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))

    def heard(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(f"{message.text} ({message.location.get('url', '')})")


def signed_in(browser: Browser, url: str, token: str, width: int, at: str = "") -> tuple[Page, Console]:
    """A new page of ``browser`` signed in to the portal at ``url`` with ``token`` (the break-glass
    form), ``width`` pixels wide, opened at ``at`` (``#/tenancy``; empty: the first page)."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    console = Console(page)
    page.goto(f"{url}/{at}")  # signed in, the address's page is the first drawn
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_selector("#page h1")
    return page, console


def axe_violations(page: Page) -> list[dict[str, Any]]:
    """What axe-core (``make axe-core``, pinned) finds wrong on ``page`` as it is drawn now, against the
    WCAG 2.1 A and AA rules and axe's best practices: each violation's ``id``, ``impact`` (minor,
    moderate, serious, critical), ``help`` and the ``nodes`` (``target``, ``html``) that break it."""
    if not AXE.is_file():
        pytest.fail(f"axe-core {AXE_CORE_VERSION} is not installed: run 'make axe-core'")
    if not page.evaluate("typeof window.axe === 'object'"):
        # evaluated, not added as a <script>: the portal's Content-Security-Policy refuses inline ones
        page.evaluate(AXE.read_text() + "\n;typeof window.axe")
    found: list[dict[str, Any]] = page.evaluate(
        """async () => {
            const tags = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"];
            const result = await axe.run(document, {runOnly: {type: "tag", values: tags}});
            return result.violations.map((v) => ({
                id: v.id, impact: v.impact, help: v.help,
                nodes: v.nodes.map((n) => ({target: n.target.join(" "), html: n.html.slice(0, 160)})),
            }));
        }"""
    )
    return found
