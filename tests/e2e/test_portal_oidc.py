"""Sign-in with an OpenID Connect provider, end to end: a real control plane, a real provider (panva's
oidc-provider, OpenID Certified, from ``make oidc-provider``, run by tests/e2e/oidc_provider.mjs) and
Debian's Chromium driven by Playwright.

The user signs in at the provider from the portal's sign-in page; the user is created with the team
role their group maps to; their group changes at the provider and the next sign-in shows the new role;
a writing call on the session cookie without the CSRF header is refused; removing the user ends the
session at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page

from llmgw.testing.cluster import Cluster

from .chromium import debian_chromium
from .oidc import running_provider, sign_in_at_provider

pytestmark = pytest.mark.e2e

CLIENT_ID, SECRET = "llmgw-portal", "a-client-secret-for-the-test-only"
USER = "ada"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("oidc")


@pytest.fixture(scope="module")
def cluster(home: Path) -> Iterator[Cluster]:
    with Cluster(home / "cluster", home / "cache") as running:
        running.start_server()
        running.admin.create_unit("orgs", {"name": "acme"})
        running.admin.create_unit("teams", {"org": "acme", "name": "ml"})
        yield running


@pytest.fixture(scope="module")
def provider(home: Path, cluster: Cluster) -> Iterator[tuple[str, Path]]:
    """The provider's issuer, and the file of its users' groups (rewritten to change them)."""
    groups = {
        "ml-members": [{"role": "member", "scope": "team:acme/ml"}],
        "ml-admins": [{"role": "team-admin", "scope": "team:acme/ml"}],
    }
    with running_provider(home, cluster, {USER: ["ml-members"]}, groups, (CLIENT_ID, SECRET)) as running:
        yield running


@pytest.fixture(scope="module")
def browser(provider: tuple[str, Path]) -> Iterator[Browser]:
    with debian_chromium() as launched:
        yield launched


def sign_in(browser: Browser, cluster: Cluster) -> Page:
    """A fresh browser (no cookies) signed in at the provider from the portal's sign-in page."""
    page = browser.new_context().new_page()
    sign_in_at_provider(page, cluster, USER)
    return page


def api(page: Page, method: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """``fetch`` from the page, with its cookies; the status and the JSON answer."""
    answer: dict[str, Any] = page.evaluate(
        """async ([method, path, headers]) => {
            const r = await fetch(path, {method, headers});
            const text = await r.text();
            return {status: r.status, body: text ? JSON.parse(text) : null};
        }""",
        [method, path, headers or {}],
    )
    return answer["status"], answer["body"]


def roles(cluster: Cluster) -> list[tuple[str, str]]:
    user = next(u for u in cluster.admin.users() if u.name == USER)
    return [(r.role, r.scope) for r in user.roles]


def test_sign_in_maps_groups_follows_their_change_and_ends_with_the_user(
    browser: Browser, cluster: Cluster, provider: tuple[str, Path]
) -> None:
    _, users = provider
    page = sign_in(browser, cluster)
    assert roles(cluster) == [("member", "team:acme/ml")]
    status, me = api(page, "GET", "/api/me")
    assert status == 200 and me["name"] == USER
    cookies = {c["name"]: c for c in page.context.cookies()}
    assert cookies["llmgw_session"]["httpOnly"] and cookies["llmgw_session"]["secure"]
    assert cookies["llmgw_session"]["sameSite"] == "Lax"

    status, refused = api(page, "POST", "/api/users/ada/tokens")
    assert status == 403 and "X-CSRF-Token" in refused["error"]["message"]
    csrf = cookies["llmgw_csrf"]["value"]
    status, _ = api(page, "DELETE", "/api/tokens/tok_00000000", {"X-CSRF-Token": csrf})
    assert status == 404  # through the CSRF check, to the route

    users.write_text(json.dumps({USER: ["ml-admins"]}))
    second = sign_in(browser, cluster)
    assert roles(cluster) == [("team-admin", "team:acme/ml")]
    status, me = api(second, "GET", "/api/me")
    assert status == 200 and me["roles"] == [{"role": "team-admin", "scope": "team:acme/ml"}]

    cluster.admin.remove_user(USER)
    status, _ = api(second, "GET", "/api/me")
    assert status == 401
    status, _ = api(page, "GET", "/api/me")
    assert status == 401


def test_the_sign_in_page_learns_the_provider_and_a_stray_callback_is_refused_clearly(
    cluster: Cluster, browser: Browser
) -> None:
    page = browser.new_context().new_page()
    page.goto(f"{cluster.url}/auth/provider")
    assert json.loads(page.inner_text("body")) == {"configured": True, "name": "Acme ID"}
    page.goto(f"{cluster.url}/auth/callback?state=x&code=y")
    assert "no sign-in is under way" in page.inner_text("body")
