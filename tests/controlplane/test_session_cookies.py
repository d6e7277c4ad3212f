"""The session cookie in front of ``/api``: let through as the session's bearer token, a writing call
only with the session's CSRF token; bearer calls and other paths untouched."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from llmgw.controlplane.admin.signin import CSRF_HEADER, SESSION_COOKIE, SessionCookies
from llmgw.core.oidc import csrf_of

SECRET = "llmgw_tok_the-session-secret"


class Seen:
    """The app behind: answers 200 with the Authorization header it was given."""

    def __init__(self) -> None:
        self.authorization: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        given = dict(scope["headers"]).get(b"authorization", b"").decode()
        self.authorization.append(given)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


async def call(method: str, path: str, headers: dict[str, str]) -> tuple[httpx.Response, Seen]:
    seen = Seen()
    transport = httpx.ASGITransport(app=SessionCookies(seen))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        return await client.request(method, path, headers=headers), seen


async def test_a_read_with_the_cookie_goes_on_as_the_sessions_bearer_token() -> None:
    answer, seen = await call("GET", "/api/me", {"cookie": f"{SESSION_COOKIE}={SECRET}; other=1"})
    assert answer.status_code == 200 and seen.authorization == [f"Bearer {SECRET}"]


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
async def test_a_write_with_the_cookie_needs_the_sessions_csrf_token(method: str) -> None:
    cookie = {"cookie": f"{SESSION_COOKIE}={SECRET}"}
    answer, seen = await call(method, "/api/keys", cookie)
    assert answer.status_code == 403 and seen.authorization == []
    assert "X-CSRF-Token" in answer.json()["error"]["message"] and answer.json()["error"]["hint"]
    answer, seen = await call(method, "/api/keys", {**cookie, CSRF_HEADER: csrf_of("another secret")})
    assert answer.status_code == 403
    answer, seen = await call(method, "/api/keys", {**cookie, CSRF_HEADER: csrf_of(SECRET)})
    assert answer.status_code == 200 and seen.authorization == [f"Bearer {SECRET}"]


async def test_bearer_calls_and_other_paths_are_untouched() -> None:
    headers = {"cookie": f"{SESSION_COOKIE}={SECRET}", "authorization": "Bearer admin-token"}
    answer, seen = await call("POST", "/api/keys", headers)
    assert answer.status_code == 200 and seen.authorization == ["Bearer admin-token"]
    answer, seen = await call("POST", "/v1/chat/completions", {"cookie": f"{SESSION_COOKIE}={SECRET}"})
    assert answer.status_code == 200 and seen.authorization == [""]
    answer, seen = await call("POST", "/api/keys", {})
    assert answer.status_code == 200 and seen.authorization == [""]
