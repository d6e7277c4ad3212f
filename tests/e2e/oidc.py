"""The real OpenID Connect provider of the sign-in tests, and a person signing in at it.

panva's oidc-provider (OpenID Certified, ``make oidc-provider``), run by ``oidc_provider.mjs``
with one confidential client whose redirect is the control plane's ``/auth/callback``; any password
signs a user in, and a user's groups are read from a JSON file at each sign-in (rewrite it to change
them).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page

from llmgw.testing.cluster import Cluster, free_port, wait_for

MODULE = Path.home() / ".cache/llmgw/oidc-provider-9.6.0/node_modules/oidc-provider/lib/index.js"
SCRIPT = Path(__file__).with_name("oidc_provider.mjs")
PROVIDER_NAME = "Acme ID"


@contextmanager
def running_provider(
    home: Path,
    cluster: Cluster,
    users: dict[str, list[str]],
    groups: dict[str, list[dict[str, Any]]],
    client: tuple[str, str],
) -> Iterator[tuple[str, Path]]:
    """The provider started with ``users`` (name to groups) and set as ``cluster``'s ``oidc.provider``
    with ``groups`` mapped to roles; its issuer, and the users' file (rewritten to change groups)."""
    if not MODULE.is_file() or shutil.which("node") is None:
        pytest.fail("oidc-provider is not installed: run 'make oidc-provider'")
    client_id, secret = client
    users_file = home / "users.json"
    users_file.write_text(json.dumps(users))
    port = free_port()
    env = {
        "OIDC_PROVIDER_MODULE": str(MODULE),
        "PORT": str(port),
        "CLIENT_ID": client_id,
        "CLIENT_SECRET": secret,
        "REDIRECT_URI": f"{cluster.url}/auth/callback",
        "USERS_FILE": str(users_file),
        "PATH": "/usr/bin:/bin",
    }
    log_path = home / "provider.log"
    log = log_path.open("wb")
    process = subprocess.Popen(["node", str(SCRIPT)], env=env, stdout=log, stderr=subprocess.STDOUT)
    issuer = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: "listening" in log_path.read_text(), 30, "the provider listens")
        secret_file = home / "client.secret"
        secret_file.write_text(secret + "\n")
        cluster.admin.set_setting(
            "oidc.provider",
            {
                "name": PROVIDER_NAME,
                "issuer": issuer,
                "client_id": client_id,
                "client_secret_file": str(secret_file),
                "groups": groups,
            },
        )
        yield issuer, users_file
    finally:
        process.terminate()
        process.wait(10)
        log.close()


def sign_in_at_provider(page: Page, cluster: Cluster, user: str) -> None:
    """From the portal's sign-in page through the provider's login and consent, back to a drawn page."""
    page.goto(f"{cluster.url}/")
    page.click(f"text=Sign in with {PROVIDER_NAME}")
    page.fill("input[name=login]", user)
    page.fill("input[name=password]", "any")
    page.click("button[type=submit]")
    page.click("button:has-text('Continue')")  # the provider's consent page
    page.wait_for_url(f"{cluster.url}/**")
    page.wait_for_selector("#page h1")
