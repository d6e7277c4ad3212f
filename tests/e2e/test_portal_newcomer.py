"""A newcomer's first hour in the portal, as a person goes through it, in Debian's headless Chromium
(driven by Playwright) against a real control plane, a real OpenID Connect provider (panva's
oidc-provider, ``make oidc-provider``) and a node serving on the real llama-server with SmolLM2.

The newcomer, whose provider group maps to the cluster's admin role, signs in at the provider; adds
SmolLM2 from the mirror on the models page and waits for it to be ready; chats in the playground and
sees the answer arrive streamed (in more than one piece); creates a team and a project on the tenancy
page and a key for the project on the keys page; sends a request with that key (httpx) and sees it
counted in the keys page's usage table. A member of another team then signs in and does not see the
project. The whole flow is timed (monotonic) and printed: ``newcomer flow: N s``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page

from llmgw.cli.up import SMOLLM2_FILE
from llmgw.testing.cluster import Cluster, wait_for

from .chromium import Console, debian_chromium
from .oidc import running_provider, sign_in_at_provider

pytestmark = pytest.mark.e2e

CLIENT_ID, SECRET = "llmgw-portal", "a-client-secret-for-the-newcomer-test"
NEWCOMER, OTHER = "noor", "wes"
MODEL = "smollm2"
PROJECT = "project:acme/ml/chat"

WATCH_THE_ANSWER = """() => {
  window.__answerLengths = [];
  new MutationObserver(() => {
    const text = document.querySelector('.turn.assistant .text');
    if (text) window.__answerLengths.push(text.textContent.length);
  }).observe(document.getElementById('pg-transcript'), {childList: true, subtree: true, characterData: true});
}"""
"""Records the assistant's text's length at each change of the transcript: a streamed answer grows."""


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("newcomer")


@pytest.fixture(scope="module")
def cluster(home: Path, engine_cache: Path, model_file: Path) -> Iterator[Cluster]:
    """A control plane with SmolLM2's file in its mirror and a node on the real llama-server; the
    organisation acme and its team web exist; no model."""
    with Cluster(home / "cluster", engine_cache) as running:
        running.start_server()
        running.upload(model_file)
        running.admin.create_unit("orgs", {"name": "acme"})
        running.admin.create_unit("teams", {"org": "acme", "name": "web"})
        running.start_agent("node1")
        wait_for(lambda: any(n["connected"] for n in running.admin.get("/api/nodes")), 60, "node1 connects")
        yield running


@pytest.fixture(scope="module")
def provider(home: Path, cluster: Cluster) -> Iterator[str]:
    """The provider's issuer, its groups mapped: platform to the cluster's admin, web-members to acme/web."""
    groups = {
        "platform": [{"role": "cluster-admin", "scope": ""}],
        "web-members": [{"role": "member", "scope": "team:acme/web"}],
    }
    users = {NEWCOMER: ["platform"], OTHER: ["web-members"]}
    with running_provider(home, cluster, users, groups, (CLIENT_ID, SECRET)) as (issuer, _):
        yield issuer


@pytest.fixture(scope="module")
def browser(provider: str) -> Iterator[Browser]:
    with debian_chromium() as launched:
        yield launched


def sign_in(browser: Browser, cluster: Cluster, user: str) -> tuple[Page, Console]:
    """A fresh browser (no cookies), 1280 px wide, signed in as ``user`` at the provider."""
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    console = Console(page)
    sign_in_at_provider(page, cluster, user)
    return page, console


def portal_errors(console: Console, issuer: str) -> list[str]:
    """The console's errors but the provider's own pages': their web font (a page off the network
    here) and the favicon the provider has not."""
    theirs = (f"({issuer}/", "(https://fonts.googleapis.com/")
    return [e for e in console.errors if not any(origin in e for origin in theirs)]


def submit(page: Page, form: str, values: dict[str, str], shown: str) -> None:
    for name, value in values.items():
        page.fill(f"#{form}-{name}", value)
    page.click(f"#{form} button[type=submit]")
    page.wait_for_selector(shown)


def requests_shown(page: Page) -> int:
    """The keys page's usage table's request count for the model, read after reloading the page
    (it reads /api/usage as it opens)."""
    page.reload()
    row = page.locator("#page tr", has=page.locator(f"td:text-is('{MODEL}')"))
    page.wait_for_selector("#usage-spend")
    if row.count() == 0:
        return 0
    return int(row.locator("td").nth(1).inner_text())


def used(cluster: Cluster) -> int:
    return sum(line["requests"] for line in cluster.admin.get("/api/usage")["lines"])


def test_a_newcomer_signs_in_serves_chats_and_makes_a_project_with_a_key(
    browser: Browser, cluster: Cluster, provider: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    page, console = sign_in(browser, cluster, NEWCOMER)

    # SmolLM2 from the mirror, on the models page, until it is ready
    page.goto(f"{cluster.url}/#/models")
    blob = page.locator("#add-blob option", has_text=SMOLLM2_FILE)
    blob.wait_for(state="attached")
    page.select_option("#add-blob", blob.get_attribute("value"))
    page.fill("#add-name", MODEL)
    page.fill("#add-ctx", "2048")
    page.fill("#add-parallel", "2")
    page.click("#add-model button[type=submit]")
    page.wait_for_selector(f"#add-model [role=status]:has-text('Model {MODEL} added')")
    row = page.locator("section:has(h2:text-is('Models')) tr", has=page.locator(f"td:text-is('{MODEL}')"))
    row.locator(".badge.ok:text-is('1 / 1')").wait_for(timeout=180_000)
    page.screenshot(path=str(tmp_path / "models.png"), full_page=True)

    # a chat in the playground, the answer streamed
    page.goto(f"{cluster.url}/#/playground")
    page.locator(f"#pg-model option[value='{MODEL}']").wait_for(state="attached")
    page.select_option("#pg-model", MODEL)
    page.fill("#pg-prompt", "Name three colours.")
    page.fill("#pg-max-tokens", "48")
    page.evaluate(WATCH_THE_ANSWER)
    page.click("#pg-send")
    answer = page.locator(".turn.assistant[data-done=true] .text")
    answer.wait_for(timeout=60_000)
    lengths = page.evaluate("window.__answerLengths.filter((n) => n > 0)")
    assert answer.inner_text().strip(), "the model answered nothing"
    assert len(set(lengths)) > 1, f"the answer came whole, not streamed: {lengths}"
    page.screenshot(path=str(tmp_path / "playground.png"), full_page=True)

    # a team and a project on the tenancy page, a key for the project on the keys page
    page.goto(f"{cluster.url}/#/tenancy")
    page.wait_for_selector("li[data-owner='org:acme']")
    submit(page, "create-team", {"org": "acme", "name": "ml"}, "li[data-owner='team:acme/ml']")
    submit(
        page, "create-project", {"org": "acme", "team": "ml", "name": "chat"}, f"li[data-owner='{PROJECT}']"
    )
    page.goto(f"{cluster.url}/#/keys")
    page.fill("#key-name", "chat-app")
    page.fill("#key-place", PROJECT)
    page.click("#create-key button[type=submit]")
    secret = page.wait_for_selector("#new-key").inner_text().strip()
    page.wait_for_selector(f"td:text-is('{PROJECT}')")

    # the playground's request is counted first, so the key's one is told apart
    wait_for(lambda: used(cluster) >= 1, 60, "the playground's request is in /api/usage")
    before = requests_shown(page)
    answered = httpx.post(
        f"{cluster.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {secret}"},
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
        timeout=60,
    )
    assert answered.status_code == 200, answered.text
    wait_for(lambda: requests_shown(page) == before + 1, 60, "the key's request in the keys page's usage")
    assert page.locator("#page svg.chart").count() >= 2  # the tokens and requests charts are drawn
    page.screenshot(path=str(tmp_path / "keys.png"), full_page=True)
    took = time.monotonic() - started
    print(f"newcomer flow: {took:.1f} s")
    assert portal_errors(console, provider) == [], console.errors
    page.close()

    # a member of another team does not see the project
    other, other_console = sign_in(browser, cluster, OTHER)
    other.goto(f"{cluster.url}/#/tenancy")
    other.wait_for_selector("li[data-owner='team:acme/web']")
    assert other.locator(f"li[data-owner='{PROJECT}']").count() == 0
    assert other.locator("li[data-owner='team:acme/ml']").count() == 0
    other.screenshot(path=str(tmp_path / "tenancy-other-team.png"), full_page=True)
    print("\n".join(f"screenshot: {shot}" for shot in sorted(tmp_path.glob("*.png"))))
    assert portal_errors(other_console, provider) == [], other_console.errors
    other.close()
