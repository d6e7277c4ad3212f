"""The portal's tenancy page in a real browser (Debian's Chromium, driven by Playwright): the admin
creates an organisation, a team and a project with the page's forms and grants a user a member role
there; that user, signed in with their own token, sees their team's project and not another team's.
Drawn at 1280 and 390 pixels wide without a console error; screenshots under the test's tmp dir.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page

from llmgw.testing.cluster import Cluster

from . import chromium
from .chromium import Console, debian_chromium

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("portal-org")
    with Cluster(home / "cluster", home / "cache") as running:
        running.start_server()
        yield running


@pytest.fixture(scope="module")
def browser(cluster: Cluster) -> Iterator[Browser]:
    with debian_chromium() as launched:
        yield launched


def signed_in(browser: Browser, cluster: Cluster, token: str, width: int) -> tuple[Page, Console]:
    page, console = chromium.signed_in(browser, cluster.url, token, width, "#/tenancy")
    page.wait_for_selector("#tenancy-tree ul, #tenancy-tree p")
    return page, console


def submit(page: Page, form: str, values: dict[str, str], shown: str) -> None:
    for name, value in values.items():
        page.fill(f"#{form}-{name}", value)
    page.click(f"#{form} button[type=submit]")
    page.wait_for_selector(shown)


def test_the_admin_builds_the_tree_and_a_member_sees_only_their_team(
    browser: Browser, cluster: Cluster, tmp_path: Path
) -> None:
    page, console = signed_in(browser, cluster, cluster.token, 1280)
    submit(page, "create-org", {"name": "acme"}, "li[data-owner='org:acme']")
    submit(page, "create-team", {"org": "acme", "name": "ml"}, "li[data-owner='team:acme/ml']")
    submit(page, "create-team", {"org": "acme", "name": "web"}, "li[data-owner='team:acme/web']")
    submit(
        page,
        "create-project",
        {"org": "acme", "team": "ml", "name": "chat"},
        "li[data-owner='project:acme/ml/chat']",
    )
    submit(
        page,
        "create-project",
        {"org": "acme", "team": "web", "name": "shop"},
        "li[data-owner='project:acme/web/shop']",
    )
    assert {u.path for u in cluster.admin.units("projects")} == {"acme/ml/chat", "acme/web/shop"}

    cluster.admin.create_user("ana")
    submit(
        page,
        "grant-role",
        {"user": "ana", "role": "member", "scope": "team:acme/ml"},
        "td:has-text('member team:acme/ml')",
    )
    roles = {(r.role, r.scope) for r in cluster.admin.users()[0].roles}
    assert ("member", "team:acme/ml") in roles

    assert console.errors == []
    # a refused form says why beside it (Chromium logs the refused request itself as an error)
    submit(page, "create-team", {"org": "nowhere", "name": "x"}, "#create-team [role=alert]")
    assert "nowhere" in page.inner_text("#create-team [role=alert]")
    assert all("404" in e and "/api/teams" in e for e in console.errors), console.errors

    chat = "project:acme/ml/chat"
    submit(page, "set-limits", {"subject": chat, "priority": "12"}, "#set-limits [role=alert]")
    assert "priority must be a whole number from 0" in page.inner_text("#set-limits [role=alert]")
    assert cluster.admin.limits() == []  # refused: nothing set
    values = {"subject": chat, "requests_per_minute": "600", "priority": "8"}
    submit(page, "set-limits", values, f"#tenancy-limits td:text-is('{chat}')")
    [limits] = cluster.admin.limits()
    assert (limits.subject, limits.requests_per_minute, limits.priority) == (chat, 600, 8)
    assert limits.concurrent is None
    row = page.locator(f"#tenancy-limits tr:has(td:text-is('{chat}')) td").all_inner_texts()
    assert row[1] == "600" and row[-1] == "8"
    page.screenshot(path=str(tmp_path / "tenancy-admin-1280.png"), full_page=True)
    page.close()

    token = cluster.admin.create_token("ana", "portal", None).token
    for width in (1280, 390):
        page, console = signed_in(browser, cluster, token, width)
        page.wait_for_selector("li[data-owner='project:acme/ml/chat']")
        assert page.locator("li[data-owner='project:acme/web/shop']").count() == 0
        assert page.locator("#create-org").count() == 0 and page.locator("#create-project").count() == 0
        shot = tmp_path / f"tenancy-member-{width}.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"screenshot: {shot}")
        assert console.errors == []
        page.close()
    first, console = chromium.signed_in(browser, cluster.url, token, 1280)  # the cluster page, first
    first.wait_for_selector("#queues")
    first.wait_for_timeout(500)  # a window for a refusal to show: the first polls go out at once
    assert console.errors == [], console.errors  # a member is not asked the cards' readings
    first.close()

    page, console = signed_in(browser, cluster, cluster.token, 1280)
    page.click("button[data-revoke='ana team:acme/ml']")
    page.wait_for_selector("button[data-revoke='ana team:acme/ml']", state="detached")
    assert cluster.admin.users()[0].roles == []
    assert console.errors == []
    page.close()
