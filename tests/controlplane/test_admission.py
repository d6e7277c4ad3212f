"""The admin side's admission: the token from the headers before any body, and the body limit."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from llmgw.controlplane.admin.admission import Admission
from llmgw.controlplane.admin.callers import Callers, LiveToken
from llmgw.controlplane.metrics.workermetrics import SummedRegistry, serve_metrics
from llmgw.core.tenancy import CLUSTER, Binding, Owner, OwnerKind, Role
from llmgw.testing.serving import serving

TOKEN = "llmgw-admin-secret"
LIMIT = 1024


class BodyReader:
    """An app that reads the whole body, counts what it saw, and answers 200 with the size."""

    def __init__(self) -> None:
        self.calls = 0
        self.seen = b""
        self.disconnected = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.calls += 1
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                break
            self.seen += message.get("body", b"")
            if not message.get("more_body", False):
                break
        body = json.dumps({"size": len(self.seen)}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", b"%d" % len(body))],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})


class Client:
    """Feeds one request through the layer: the body in chunks, recording what the app was given."""

    def __init__(self, app: BodyReader) -> None:
        self.app = app
        self.layer = Admission(app, Callers(hashlib.sha256(TOKEN.encode()).hexdigest()), LIMIT)
        self.chunks_taken = 0

    async def request(
        self,
        method: str,
        path: str,
        chunks: list[bytes] | None = None,
        *,
        token: str | None = TOKEN,
        length: int | None = None,
    ) -> tuple[int, dict[str, Any], dict[bytes, bytes]]:
        headers = [(b"host", b"cp1")]
        if token is not None:
            headers.append((b"authorization", f"Bearer {token}".encode()))
        if length is not None:
            headers.append((b"content-length", str(length).encode()))
        pending = list(chunks or [b""])
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            self.chunks_taken += 1
            if not pending:
                return {"type": "http.disconnect"}
            chunk = pending.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(pending)}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": method, "path": path, "headers": headers, "query_string": b""}
        await self.layer(scope, receive, send)
        start = next(m for m in sent if m["type"] == "http.response.start")
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return start["status"], json.loads(body), dict(start["headers"])


@pytest.fixture
def app() -> BodyReader:
    return BodyReader()


@pytest.fixture
def client(app: BodyReader) -> Client:
    return Client(app)


@pytest.mark.parametrize("token", [None, "wrong"])
async def test_an_api_request_without_the_token_is_refused_before_its_body_is_read(
    client: Client, app: BodyReader, token: str | None
) -> None:
    status, body, headers = await client.request("POST", "/api/models", [b'{"name": "m"}'], token=token)
    assert status == 401
    assert body["error"]["message"] == "missing, wrong, expired or revoked token"
    assert "admin.token" in body["error"]["hint"]
    assert headers[b"www-authenticate"] == b"Bearer"
    assert client.chunks_taken == 0 and app.calls == 0


async def test_an_unknown_api_path_wants_the_token_too(client: Client, app: BodyReader) -> None:
    status, _, _ = await client.request("GET", "/api/nothing-here", token=None)
    assert status == 401 and app.calls == 0


@pytest.mark.parametrize("path", ["/healthz", "/leader", "/api/docs", "/api/openapi.json"])
async def test_public_paths_answer_without_the_token(client: Client, app: BodyReader, path: str) -> None:
    status, _, _ = await client.request("GET", path, token=None)
    assert status == 200 and app.calls == 1


@pytest.mark.parametrize("token", [None, "wrong"])
async def test_metrics_without_a_live_token_is_refused_401(
    client: Client, app: BodyReader, token: str | None
) -> None:
    status, body, headers = await client.request("GET", "/metrics", token=token)
    assert status == 401 and app.calls == 0
    assert "admin.token" in body["error"]["hint"] and "metrics_address" in body["error"]["hint"]
    assert headers[b"www-authenticate"] == b"Bearer"


async def test_metrics_with_the_admin_token_reaches_the_app(client: Client, app: BodyReader) -> None:
    status, _, _ = await client.request("GET", "/metrics")
    assert status == 200 and app.calls == 1


def viewer_tokens(callers: Callers, **roles: Binding) -> dict[str, str]:
    """A live token for each user, bound as given; returns the tokens by user."""
    tokens = {user: f"llmgw-user-{user}" for user in roles}
    callers.replace(
        {hashlib.sha256(t.encode()).hexdigest(): LiveToken(user, None) for user, t in tokens.items()},
        {user: [binding] for user, binding in roles.items()},
    )
    return tokens


async def test_metrics_is_for_viewers_of_the_cluster_and_refused_403_to_a_projects_member(
    app: BodyReader,
) -> None:
    callers = Callers(hashlib.sha256(TOKEN.encode()).hexdigest())
    tokens = viewer_tokens(
        callers,
        ops=Binding(Role.VIEWER, CLUSTER),
        bob=Binding(Role.TEAM_ADMIN, Owner(OwnerKind.TEAM, "globex/r")),
    )
    client = Client(app)
    client.layer = Admission(app, callers, LIMIT)
    status, _, _ = await client.request("GET", "/metrics", token=tokens["ops"])
    assert status == 200 and app.calls == 1
    status, body, _ = await client.request("GET", "/metrics", token=tokens["bob"])
    assert status == 403 and app.calls == 1
    assert body["error"]["message"].startswith("bob may not read the cluster's metrics")
    assert "viewer" in body["error"]["hint"]


async def test_metrics_served_on_an_address_of_its_own_is_404_here_whatever_the_token(
    app: BodyReader,
) -> None:
    client = Client(app)
    client.layer = Admission(app, Callers(hashlib.sha256(TOKEN.encode()).hexdigest()), LIMIT, "10.0.0.5:9108")
    status, body, _ = await client.request("GET", "/metrics")
    assert status == 404 and app.calls == 0
    assert "http://10.0.0.5:9108/metrics" in body["error"]["message"]


async def test_the_gateway_is_passed_through_with_its_own_keys_and_limit(
    client: Client, app: BodyReader
) -> None:
    big = b"x" * (LIMIT * 4)
    status, body, _ = await client.request("POST", "/v1/chat/completions", [big], token="sk-a-gateway-key")
    assert status == 200 and body == {"size": len(big)}


async def test_an_authorised_request_reaches_the_app_with_its_body(client: Client, app: BodyReader) -> None:
    status, body, _ = await client.request("PUT", "/api/settings", [b"a" * 600, b"b" * 424], length=LIMIT)
    assert status == 200 and body == {"size": LIMIT}


async def test_a_content_length_past_the_limit_is_answered_413_without_reading(
    client: Client, app: BodyReader
) -> None:
    status, body, _ = await client.request("POST", "/api/models", [b"x"], length=LIMIT + 1)
    assert status == 413
    assert f"({LIMIT} bytes)" in body["error"]["message"]
    assert "http.api_body_max_bytes" in body["error"]["hint"]
    assert client.chunks_taken == 0 and app.calls == 0


async def test_a_streamed_body_past_the_limit_is_answered_413_and_the_app_sees_the_client_go(
    client: Client, app: BodyReader
) -> None:
    chunks = [b"x" * 512, b"x" * 512, b"x" * 512, b"x" * 512]
    status, body, _ = await client.request("POST", "/api/models", chunks)
    assert status == 413 and f"({LIMIT} bytes)" in body["error"]["message"]
    assert app.disconnected and len(app.seen) <= LIMIT
    assert client.chunks_taken == 3  # the chunk that passed the limit is the last one taken


async def test_an_app_that_fails_on_a_refused_body_leaves_the_413_as_the_answer(client: Client) -> None:
    async def strict(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        raise RuntimeError("the client went away")

    client.layer = Admission(strict, Callers(hashlib.sha256(TOKEN.encode()).hexdigest()), LIMIT)
    status, _, _ = await client.request("POST", "/api/models", [b"x" * 800, b"x" * 800])
    assert status == 413


async def test_uploads_into_the_mirror_have_no_limit_here_but_want_the_token(
    client: Client, app: BodyReader
) -> None:
    chunks = [b"w" * LIMIT] * 5
    status, body, _ = await client.request("POST", "/api/mirror/blobs", chunks, length=5 * LIMIT)
    assert status == 200 and body == {"size": 5 * LIMIT}
    status, _, _ = await client.request("POST", "/api/mirror/blobs", chunks, token=None)
    assert status == 401 and app.calls == 1


async def test_the_real_admin_app_behind_it_answers_in_its_error_shape_only_once_admitted() -> None:
    admin = FastAPI()

    @admin.post("/api/echo")
    async def echo(payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    layer = Admission(admin, Callers(hashlib.sha256(TOKEN.encode()).hexdigest()), LIMIT)
    transport = httpx.ASGITransport(app=layer)
    async with httpx.AsyncClient(transport=transport, base_url="http://cp1") as http:
        refused = await http.post(
            "/api/echo", json={"a": "x" * LIMIT}, headers={"authorization": f"Bearer {TOKEN}"}
        )
        admitted = await http.post("/api/echo", json={"a": 1}, headers={"authorization": f"Bearer {TOKEN}"})
    assert refused.status_code == 413 and set(refused.json()["error"]) == {"message", "hint"}
    assert admitted.status_code == 200 and admitted.json() == {"a": 1}


async def refresh_nothing() -> None:
    return None


@pytest.mark.parametrize("path", ["/api/settings", "/", "/portal/app.js", "/metrics", "/healthz"])
async def test_two_authorization_headers_are_refused_400_over_a_socket_on_every_path(
    app: BodyReader, path: str
) -> None:
    """Past the admission layer, and the control plane's /metrics in front of it when it has workers:
    which of the two a route would have taken is never a question."""
    layer = Admission(app, Callers(hashlib.sha256(TOKEN.encode()).hexdigest()), LIMIT)
    edge = serve_metrics(layer, SummedRegistry(CollectorRegistry(), list), refresh_nothing, lambda _: None)
    bearer = f"Bearer {TOKEN}"
    async with serving(edge) as url, httpx.AsyncClient(base_url=url) as http:
        refused = await http.get(path, headers=[("Authorization", bearer), ("Authorization", bearer)])
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert "more than one Authorization header" in error["message"] and "send one" in error["hint"]
        assert app.calls == 0
        one = await http.get(path, headers={"Authorization": bearer})
        assert one.status_code == 200
