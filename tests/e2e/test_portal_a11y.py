"""The portal checked for accessibility with axe-core (``make axe-core``, pinned, from npm) in Debian's
headless Chromium driven by Playwright: the admin signed in on a cluster with a GPU node (the
nvidia-smi stand-in) serving a model (the llama-server stand-in), every page of app.js's ``PAGES``
(read from app.js, so a page added there is checked too) and the sign-in page, at 1280 and 390 pixels
wide. No violation of impact "serious" or "critical" is allowed; the moderate and minor ones are
printed. A screenshot of each page at each width is saved under the test's tmp dir, its path printed
(``pytest -s``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from playwright.sync_api import Browser, Page

from llmgw.testing.cluster import Cluster
from llmgw.testing.llama_server_standin import write_launcher
from llmgw.testing.nvidia_smi_standin import H100_80G, RTX_4090, install_fake_nvidia_smi

from . import chromium
from .chromium import axe_violations, debian_chromium

pytestmark = pytest.mark.e2e

MODEL = "standin-a11y"
WIDTHS = (1280, 390)
APP_JS = Path(__file__).parents[2] / "src/llmgw/portal/static/js/app.js"
BLOCKING = {"serious", "critical"}

TRACK_FETCHES = """
window.__pending = 0;
const fetched = window.fetch;
window.fetch = (input, init) => {
  const url = typeof input === "string" ? input : input.url;
  if (url.includes("/api/events")) return fetched(input, init);  // the live stream stays open
  window.__pending += 1;
  return fetched(input, init).finally(() => { window.__pending -= 1; });
};
"""
"""Counts the page's fetches still under way, the live stream apart: a page has drawn what the
cluster holds once none is."""

DRAWN = """() => document.querySelector('#page h1') !== null && window.__pending === 0
    && document.getElementById('live-state')?.textContent === 'live'"""


def portal_pages() -> list[str]:
    """The paths of app.js's PAGES, in its order."""
    listed = re.search(r"const PAGES = \[(.*?)\];", APP_JS.read_text(), re.S)
    assert listed, f"no PAGES list in {APP_JS}"
    return re.findall(r'path: "([\w-]+)"', listed.group(1))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("portal-a11y")
    with Cluster(home / "cluster", home / "cache") as running:
        running.start_server()
        weights = home / "weights.gguf"
        weights.write_bytes(b"GGUF stand-in for the accessibility check\n")
        running.add_model(MODEL, weights)
        bin_dir = home / "bin"
        smi = install_fake_nvidia_smi(bin_dir, [H100_80G, RTX_4090])
        launcher = write_launcher(bin_dir / "llama-server")
        running.add_node("gpu1", nvidia_smi=str(smi), engines={"llamacpp": {"binary": str(launcher)}})
        running.start_agent("gpu1")
        running.wait_ready(MODEL, 60)
        running.create_key("a11y-traffic")
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key=running.key, max_retries=0, timeout=30)
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        yield running


@pytest.fixture(scope="module")
def browser(cluster: Cluster) -> Iterator[Browser]:
    with debian_chromium() as launched:
        yield launched


def report(name: str, width: int, violations: list[dict[str, Any]]) -> list[str]:
    """One line per violation and the elements it names (the first three)."""
    lines = []
    for v in violations:
        where = "; ".join(node["target"] for node in v["nodes"][:3])
        lines.append(f"{name} at {width} px: {v['impact']} {v['id']} ({v['help']}): {where}")
    return lines


def check(page: Page, name: str, width: int, shots: Path) -> tuple[list[str], list[str]]:
    """The page's screenshot saved; its blocking violations and the others, as lines."""
    shot = shots / f"{name}-{width}.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    found = axe_violations(page)
    blocking = [v for v in found if v["impact"] in BLOCKING]
    rest = [v for v in found if v["impact"] not in BLOCKING]
    return report(name, width, blocking), report(name, width, rest)


def test_the_pages_are_read_from_app_js() -> None:
    pages = portal_pages()
    assert pages[0] == "cluster" and {"nodes", "models", "playground", "keys", "settings"} <= set(pages)


@pytest.mark.parametrize("width", WIDTHS)
def test_every_page_has_no_serious_accessibility_violation(
    browser: Browser, cluster: Cluster, tmp_path: Path, width: int
) -> None:
    blocking: list[str] = []
    moderate: list[str] = []

    first = browser.new_page(viewport={"width": width, "height": 900})
    first.goto(f"{cluster.url}/")
    first.wait_for_selector("#token")
    said, rest = check(first, "signin", width, tmp_path)
    blocking += said
    moderate += rest
    first.close()

    page, console = chromium.signed_in(browser, cluster.url, cluster.token, width)
    page.add_init_script(TRACK_FETCHES)
    for name in [*portal_pages(), "nodes/gpu1"]:
        page.goto(f"{cluster.url}/#/{name}")
        page.reload()  # the fetch counter is installed on a new document
        page.wait_for_function(DRAWN, timeout=30_000)
        said, rest = check(page, name.replace("/", "-"), width, tmp_path)
        blocking += said
        moderate += rest
    print("\n".join(f"not blocking: {line}" for line in moderate))
    assert blocking == [], "\n".join(blocking)
    assert console.errors == []
    page.close()
