"""The portal's files: served at / and /portal/..., without a token, and nothing else in their place."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import httpx
import pytest

from llmgw.controlplane.admin.admission import Admission
from llmgw.controlplane.admin.callers import Callers
from llmgw.portal.serving import PREFIX, Portal, shipped_assets

TOKEN = "llmgw-admin-secret"


class Behind:
    """The app behind the portal: answers 200 and records the paths it was given."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.paths.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"6")]})
        await send({"type": "http.response.body", "body": b"behind"})


@pytest.fixture
def behind() -> Behind:
    return Behind()


@pytest.fixture
async def client(behind: Behind) -> Any:
    callers = Callers(hashlib.sha256(TOKEN.encode()).hexdigest())
    app = Admission(Portal(behind), callers, 1024)  # as the control plane stacks them
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cp") as http:
        yield http


async def test_the_page_and_its_files_answer_without_a_token(client: httpx.AsyncClient) -> None:
    page = await client.get("/")
    script = await client.get("/portal/js/app.js")

    assert (page.status_code, page.headers["content-type"]) == (200, "text/html; charset=utf-8")
    assert '<script type="module" src="/portal/js/app.js">' in page.text
    assert (script.status_code, script.headers["content-type"]) == (200, "text/javascript; charset=utf-8")


async def test_the_api_still_wants_the_token_and_other_paths_reach_the_app(
    client: httpx.AsyncClient, behind: Behind
) -> None:
    assert (await client.get("/api/nodes")).status_code == 401
    assert (await client.get("/api/nodes", headers={"Authorization": f"Bearer {TOKEN}"})).text == "behind"
    assert (await client.get("/healthz")).text == "behind"
    assert behind.paths == ["/api/nodes", "/healthz"]


async def test_every_file_carries_a_policy_that_allows_this_origin_alone(client: httpx.AsyncClient) -> None:
    answer = await client.get("/portal/portal.css")

    policy = answer.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy and "connect-src 'self'" in policy
    assert answer.headers["x-content-type-options"] == "nosniff"


async def test_a_file_not_shipped_is_404_with_what_to_do(client: httpx.AsyncClient, behind: Behind) -> None:
    for path in (
        "/portal/nope.js",
        "/portal/%2e%2e/pyproject.toml",
        "/portal/serving.py",
        "/portal/__init__.py",
    ):
        answer = await client.get(path)
        assert answer.status_code == 404, path
        assert answer.json()["error"]["hint"] == "open the portal at /"
    assert behind.paths == []


async def test_only_get_and_head_are_answered(client: httpx.AsyncClient) -> None:
    posted = await client.post("/", content=b"x")
    head = await client.head("/portal/js/app.js")

    assert (posted.status_code, posted.headers["allow"]) == (405, "GET, HEAD")
    assert (head.status_code, head.content) == (200, b"")
    assert int(head.headers["content-length"]) > 0


async def test_an_unchanged_file_is_answered_304(client: httpx.AsyncClient) -> None:
    first = await client.get("/portal/js/api.js")
    again = await client.get("/portal/js/api.js", headers={"If-None-Match": first.headers["etag"]})

    assert (again.status_code, again.content) == (304, b"")


async def test_the_bare_prefix_leads_to_the_page(client: httpx.AsyncClient) -> None:
    answer = await client.get("/portal")
    assert (answer.status_code, answer.headers["location"]) == (308, "/")


IMPORT = re.compile(r"""(?:import|from)\s*(?:[^"';]*?\sfrom\s*)?["'](\.{1,2}/[^"']+)["']""")


def test_every_module_a_script_imports_is_shipped() -> None:
    assets = shipped_assets()
    scripts = {path: asset for path, asset in assets.items() if path.endswith(".js")}
    assert f"{PREFIX}js/app.js" in scripts
    for path, asset in scripts.items():
        base = path.rsplit("/", 1)[0]
        for target in IMPORT.findall(asset.body.decode()):
            parts = base.split("/")
            for piece in target.split("/"):
                if piece == "..":
                    parts.pop()
                elif piece != ".":
                    parts.append(piece)
            assert "/".join(parts) in assets, f"{path} imports {target}, which is not shipped"


def test_the_page_names_only_files_that_are_shipped() -> None:
    assets = shipped_assets()
    page = assets["/"].body.decode()
    for named in re.findall(r'(?:src|href)="(/portal/[^"]+)"', page):
        assert named in assets, named
