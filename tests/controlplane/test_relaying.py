"""Standbys relay /api and /v1 to the leader; the leader answers only listed control planes while it leads.

Two control planes share one SQLite store; the relay between them is a
function here (over gRPC in production: tests/protocol/test_grpc_relaying.py,
and end to end in tests/e2e/test_relaying.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.controlplane.admin.app import AdminApi
from llmgw.controlplane.lifecycle.leadership import Identity, Leadership
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.controlplane.serving.asgi_calls import AnswerBrokeOff, call_app
from llmgw.controlplane.serving.httpserving import route_by_prefix
from llmgw.controlplane.serving.relaying import REPLAY_LIMIT, RelayAnswering, StandbyForwarding
from llmgw.core.relays import RelayChunk, RelayInHand, RelayPeer, RelayRequest
from llmgw.errors import ChannelClosed, NotLeader, Unauthorized
from llmgw.gateway.app import Gateway
from llmgw.mirror.blobs import BlobStore
from llmgw.store import Fence, Leases, Store
from llmgw.testing.eventually import eventually
from llmgw.testing.serving import serving

TOKEN = "llmgw-admin-test"


class Plane:
    def __init__(self, store: Store, name: str, tmp_path: Path) -> None:
        fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
        self.gateway = Gateway()
        self.leadership = Leadership(
            Leases(store), Fence(name), Identity(name, f"{name}:8443", f"http://{name}:8080"), lease_s=30
        )
        self.admin = AdminApi(
            name=name,
            token_sha256=hashlib.sha256(TOKEN.encode()).hexdigest(),
            store=store,
            fleet=fleet,
            reconciler=Reconciler(store, fleet, on_stopped=self.gateway.feed.set_stopped),
            blobs=BlobStore(tmp_path / name),
            on_keys_changed=lambda: asyncio.sleep(0),
            leadership=self.leadership,
        )
        self.app = self.admin.app()
        self.answering = RelayAnswering(self.app, self.leadership)


@pytest.fixture
async def planes(tmp_path: Path) -> AsyncIterator[dict[str, Plane]]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    found = {name: Plane(store, name, tmp_path) for name in ("cp1", "cp2")}
    await found["cp1"].leadership.round()
    await found["cp2"].leadership.round()
    await found["cp1"].leadership.round()  # now lists cp2
    yield found
    await store.close()


def in_process(
    planes: dict[str, Plane], calls: list[str] | None = None, answering: RelayAnswering | None = None
) -> Any:
    """A relay from cp2 to the plane at the address, within this process (``answering`` in its place)."""

    async def relay(
        address: str, request: RelayRequest, body: AsyncIterable[bytes], connect_s: float
    ) -> AsyncIterator[RelayChunk]:
        if calls is not None:
            calls.append(address)
        leader = answering or planes[address.split(":")[0]].answering
        async for chunk in leader.answer(RelayPeer("cp2", control_plane=True), RelayInHand(request, body)):
            yield chunk

    return relay


def standby_client(planes: dict[str, Plane], calls: list[str], wait_s: float = 5) -> httpx.AsyncClient:
    front = StandbyForwarding(planes["cp2"].app, planes["cp2"].leadership, in_process(planes, calls), wait_s)
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=front),
        base_url="http://cp2",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )


async def test_a_standby_relays_api_calls_to_the_leader(planes: dict[str, Plane]) -> None:
    calls: list[str] = []
    async with standby_client(planes, calls) as client:
        status = (await client.get("/api/status")).json()
        added = await client.post("/api/keys", json={"name": "through-cp2"})
    assert calls == ["cp1:8443", "cp1:8443"]
    assert (status["name"], status["leader"], status["standbys"]) == ("cp1", "cp1", ["cp2"])
    assert added.status_code == 201
    assert [k["name"] for k in (await _local(planes["cp1"], "GET", "/api/keys"))] == ["through-cp2"]


async def test_the_leader_refuses_a_certificate_naming_no_listed_control_plane(
    planes: dict[str, Plane],
) -> None:
    request = RelayInHand(RelayRequest(method="GET", path="/api/status"))
    with pytest.raises(Unauthorized, match="names no control plane"):
        await anext(planes["cp1"].answering.answer(RelayPeer("node1", control_plane=True), request))


async def test_the_leader_refuses_a_node_certificate_even_under_a_control_planes_name(
    planes: dict[str, Plane],
) -> None:
    request = RelayInHand(RelayRequest(method="GET", path="/api/status"))
    with pytest.raises(Unauthorized, match="'cp2' is a node's"):
        await anext(planes["cp1"].answering.answer(RelayPeer("cp2", control_plane=False), request))


async def test_a_standby_refuses_to_answer_a_relay(planes: dict[str, Plane]) -> None:
    request = RelayInHand(RelayRequest(method="GET", path="/api/status"))
    with pytest.raises(NotLeader):
        await anext(planes["cp2"].answering.answer(RelayPeer("cp1", control_plane=True), request))


async def test_a_standby_holds_a_request_and_its_body_while_no_one_leads_and_serves_it_once_it_leads(
    planes: dict[str, Plane],
) -> None:
    tried: list[str] = []

    async def unreachable(
        address: str, request: RelayRequest, body: AsyncIterable[bytes], connect_s: float
    ) -> AsyncIterator[RelayChunk]:
        tried.append(address)
        raise ChannelClosed(f"cannot reach the control plane at {address}", "waiting")
        yield RelayChunk()  # pragma: no cover - makes this a generator

    cp2 = planes["cp2"]
    front = StandbyForwarding(cp2.app, cp2.leadership, unreachable, 10)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=front),
        base_url="http://cp2",
        headers={"Authorization": f"Bearer {TOKEN}"},
    ) as client:
        pending = asyncio.create_task(client.post("/api/keys", json={"name": "held"}))
        await eventually(lambda: tried, message="the standby tried the unreachable leader")
        assert not pending.done()  # and holds the request, waiting for a leader
        await planes["cp1"].leadership.resign()
        await cp2.leadership.round()
        answer = await asyncio.wait_for(pending, 5)
    assert answer.status_code == 201
    assert [k["name"] for k in await _local(cp2, "GET", "/api/keys")] == ["held"]


async def test_a_standby_answers_503_when_no_one_leads_within_the_wait(planes: dict[str, Plane]) -> None:
    async def unreachable(
        address: str, request: RelayRequest, body: AsyncIterable[bytes], connect_s: float
    ) -> AsyncIterator[RelayChunk]:
        raise ChannelClosed(f"cannot reach the control plane at {address}", "waiting")
        yield RelayChunk()  # pragma: no cover - makes this a generator

    front = StandbyForwarding(planes["cp2"].app, planes["cp2"].leadership, unreachable, 0.2)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=front), base_url="http://cp2") as client:
        answer = await client.post("/v1/chat/completions", json={})
    assert answer.status_code == 503
    assert "no control plane leads" in answer.json()["error"]["message"]


async def test_leader_answers_200_only_on_the_leader(planes: dict[str, Plane]) -> None:
    for name, code in (("cp1", 200), ("cp2", 503)):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=planes[name].app), base_url="http://x"
        ) as c:
            answer = await c.get("/leader")
        assert (answer.status_code, answer.json()["holder"]) == (code, "cp1")


async def test_stop_and_start_set_serving_and_the_gateway_refuses_posts_while_stopped(
    planes: dict[str, Plane],
) -> None:
    cp1 = planes["cp1"]
    assert (await _local(cp1, "PUT", "/api/serving", {"stopped": True})) == {"stopped": True}
    assert (await _local(cp1, "GET", "/api/status"))["stopped"] is True
    served = route_by_prefix(cp1.gateway.asgi_app(), cp1.app)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=served), base_url="http://x") as client:
        answer = await client.post("/v1/chat/completions", json={})
        assert (answer.status_code, answer.json()["error"]["code"]) == (503, "system_stopped")
        await _local(cp1, "PUT", "/api/serving", {"stopped": False})
        assert (await _local(cp1, "GET", "/api/status"))["stopped"] is False
        answer = await client.post("/v1/chat/completions", json={})
        assert answer.json()["error"]["code"] == "invalid_api_key"  # served again: the key is checked
    assert [e["action"] for e in await _local(cp1, "GET", "/api/audit")] == ["serving.start", "serving.stop"]


LARGE = 64 << 20
"""The largest body relayed each way through a standby here: twice the gateway's limit on /v1."""


def generated(size: int, piece: int = 1 << 20) -> AsyncIterator[bytes]:
    async def pieces() -> AsyncIterator[bytes]:
        block = hashlib.sha256(b"relay").digest() * (piece // 32)
        for start in range(0, size, piece):
            yield block[: min(piece, size - start)]

    return pieces()


class Client:
    """A client of the standby, driven by hand: its messages, what it was sent, and when it leaves."""

    def __init__(self, *messages: dict[str, Any]) -> None:
        self.messages = list(messages)
        self.sent: list[dict[str, Any]] = []
        self.leaves = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        if self.messages:
            message = self.messages.pop(0)
            if message["type"] == "wait":
                await message["for"].wait()
                return await self.receive()
            return message
        await self.leaves.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)


def body(data: bytes, more: bool = False) -> dict[str, Any]:
    return {"type": "http.request", "body": data, "more_body": more}


def http_scope(method: str, path: str) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "query_string": b"", "headers": []}


class LeaderApp:
    """The leader's app in these tests: it records what its receive gives, answers in two parts, and
    then waits on receive for its client to go away."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.first_body = asyncio.Event()
        self.answering = asyncio.Event()
        self.done = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            while True:
                message = await receive()
                self.received.append(message)
                self.first_body.set()
                if message["type"] == "http.disconnect":
                    return
                if not message.get("more_body", False):
                    break
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"first", "more_body": True})
            self.answering.set()
            self.received.append(await receive())
        finally:
            self.done.set()

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.received)

    def ends(self) -> list[tuple[str, bool]]:
        """How each message ended: its type, and whether more body was to come."""
        return [(m["type"], m.get("more_body", False)) for m in self.received if m.get("body", b"") == b""]


def standby_front(planes: dict[str, Plane], app: LeaderApp) -> StandbyForwarding:
    answering = RelayAnswering(app, planes["cp1"].leadership)
    return StandbyForwarding(
        planes["cp2"].app, planes["cp2"].leadership, in_process(planes, answering=answering), 5
    )


async def test_a_client_leaving_the_standby_is_a_disconnect_at_the_leaders_app(
    planes: dict[str, Plane],
) -> None:
    app, client = LeaderApp(), Client(body(b"{}"))
    relaying = asyncio.create_task(
        standby_front(planes, app)(http_scope("POST", "/v1/chat/completions"), client.receive, client.send)
    )
    await asyncio.wait_for(app.answering.wait(), 5)
    client.leaves.set()

    await asyncio.wait_for(app.done.wait(), 5)
    await asyncio.wait_for(relaying, 5)
    assert app.body() == b"{}"
    assert app.ends() == [("http.request", False), ("http.disconnect", False)]


async def test_a_body_cut_off_by_the_client_is_a_disconnect_at_the_leaders_app(
    planes: dict[str, Plane],
) -> None:
    app, client = LeaderApp(), Client(body(b"part", more=True), {"type": "http.disconnect"})
    await asyncio.wait_for(
        standby_front(planes, app)(http_scope("POST", "/api/mirror/blobs"), client.receive, client.send), 5
    )

    assert app.body() == b"part"
    assert app.ends() == [("http.disconnect", False)]


async def test_the_body_reaches_the_leaders_app_while_the_client_still_sends_it(
    planes: dict[str, Plane],
) -> None:
    app = LeaderApp()
    client = Client(body(b"one", more=True), {"type": "wait", "for": app.first_body}, body(b"two"))
    relaying = asyncio.create_task(
        standby_front(planes, app)(http_scope("POST", "/v1/completions"), client.receive, client.send)
    )

    await asyncio.wait_for(app.answering.wait(), 5)  # held whole, the body would never reach the app
    client.leaves.set()
    await asyncio.wait_for(relaying, 5)
    assert app.body() == b"onetwo"


async def test_a_large_upload_through_a_standby_reaches_the_leaders_mirror(planes: dict[str, Plane]) -> None:
    expected = hashlib.sha256()
    async for piece in generated(LARGE):
        expected.update(piece)
    async with standby_client(planes, []) as client:
        answer = await client.post("/api/mirror/blobs?filename=large.gguf", content=generated(LARGE))

    assert answer.status_code == 201, answer.text
    assert (answer.json()["size"], answer.json()["sha256"]) == (LARGE, expected.hexdigest())


async def test_a_large_answer_through_a_standby_streams_back(planes: dict[str, Plane]) -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        async for piece in generated(LARGE, 4 << 20):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    answering = RelayAnswering(app, planes["cp1"].leadership)
    front = StandbyForwarding(
        planes["cp2"].app, planes["cp2"].leadership, in_process(planes, answering=answering), 5
    )
    size = 0
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=front), base_url="http://cp2") as client:
        async with client.stream("GET", "/api/large") as answer:
            async for data in answer.aiter_raw():
                size += len(data)
    assert size == LARGE


async def test_a_long_body_already_sent_to_a_leader_that_failed_is_answered_503_to_send_again(
    planes: dict[str, Plane],
) -> None:
    async def failing(
        address: str, request: RelayRequest, body: AsyncIterable[bytes], connect_s: float
    ) -> AsyncIterator[RelayChunk]:
        async for _ in body:
            pass
        raise ChannelClosed(f"relaying to {address} failed", "retrying")
        yield RelayChunk()  # pragma: no cover - makes this a generator

    front = StandbyForwarding(planes["cp2"].app, planes["cp2"].leadership, failing, 5)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=front), base_url="http://cp2") as client:
        answer = await asyncio.wait_for(
            client.post("/v1/completions", content=generated(2 * REPLAY_LIMIT)), 5
        )
    assert answer.status_code == 503
    assert answer.json()["error"]["hint"] == "send the request again"


async def test_an_answer_the_leaders_app_breaks_off_is_not_taken_for_whole() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        raise RuntimeError("the app failed mid-answer")

    chunks = call_app(app, RelayRequest("GET", "/api/status"), _given())
    assert (await anext(chunks)).data == b"part"
    with pytest.raises(AnswerBrokeOff, match="broke off"):
        await anext(chunks)


async def _local(plane: Plane, method: str, path: str, body: Any = None) -> Any:
    request = RelayRequest(
        method=method,
        path=path,
        headers=(("authorization", f"Bearer {TOKEN}"),)
        + ((("content-type", "application/json"),) if body is not None else ()),
    )
    chunks = [
        chunk
        async for chunk in call_app(
            plane.app, request, _given(json.dumps(body).encode() if body is not None else b"")
        )
    ]
    assert chunks[0].status < 400, chunks[0]
    return json.loads(b"".join(c.data for c in chunks))


async def _given(*pieces: bytes) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


async def test_events_through_a_standby_stream_from_the_leader_until_the_client_leaves(
    planes: dict[str, Plane],
) -> None:
    front = StandbyForwarding(planes["cp2"].app, planes["cp2"].leadership, in_process(planes), 5)
    leader = planes["cp1"].admin.state.changes
    async with serving(front) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with client.stream("GET", "/api/events", headers=headers) as answer:
            assert answer.headers["content-type"].startswith("text/event-stream")
            lines = answer.aiter_lines()
            kinds = []
            async for line in lines:
                if line.startswith("event: "):
                    kinds.append(line.removeprefix("event: "))
                if line.startswith("data: ") and kinds[-1] == "status":
                    assert json.loads(line.removeprefix("data: "))["name"] == "cp1"
                    break
            assert kinds == ["nodes", "replicas", "models", "settings", "serving", "keys", "status"]
            assert leader.subscribers == 1
            leader.changed("keys")  # the leader's own publisher: told where the change happens
            async for line in lines:
                if line.startswith("event: "):
                    assert line == "event: keys"
                    break
        await eventually(lambda: leader.subscribers == 0, message="the leader dropped the subscription")


async def test_a_leader_that_stops_leading_ends_its_event_streams(planes: dict[str, Plane]) -> None:
    cp1 = planes["cp1"]
    async with serving(cp1.app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with client.stream("GET", "/api/events", headers=headers) as answer:
            lines = answer.aiter_lines()
            async for line in lines:
                if line == "event: status":
                    break
            await cp1.leadership.resign()
            cp1.admin.state.changes.changed("nodes")  # as its agents go when it stops leading
            rest = [line async for line in lines]
    assert not any(line.startswith("event:") for line in rest)
    assert cp1.admin.state.changes.subscribers == 0
