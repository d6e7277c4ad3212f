"""Standbys relay /api and /v1 to the leader; the leader answers only listed control planes while it leads.

Two control planes share one SQLite store; the relay between them is a
function here (over gRPC in production, tested end to end).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.controlplane.admin import AdminApi, address_is_local
from llmgw.controlplane.fleet import Fleet
from llmgw.controlplane.httpserving import route_by_prefix
from llmgw.controlplane.leadership import Identity, Leadership
from llmgw.controlplane.reconciling import Reconciler
from llmgw.controlplane.relaying import RelayAnswering, StandbyForwarding, call_app
from llmgw.core.relays import RelayChunk, RelayPeer, RelayRequest
from llmgw.errors import ChannelClosed, NotLeader, Unauthorized
from llmgw.gateway.app import Gateway
from llmgw.mirror.blobs import BlobStore
from llmgw.store import Fence, Leases, Store

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


def standby_client(planes: dict[str, Plane], calls: list[str], wait_s: float = 5) -> httpx.AsyncClient:
    async def relay(address: str, request: RelayRequest, connect_s: float) -> AsyncIterator[RelayChunk]:
        calls.append(address)
        plane = planes[address.split(":")[0]]
        async for chunk in plane.answering.answer(RelayPeer("cp2", control_plane=True), request):
            yield chunk

    front = StandbyForwarding(planes["cp2"].app, planes["cp2"].leadership, relay, wait_s)
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
    request = RelayRequest(method="GET", path="/api/status")
    with pytest.raises(Unauthorized, match="names no control plane"):
        await anext(planes["cp1"].answering.answer(RelayPeer("node1", control_plane=True), request))


async def test_the_leader_refuses_a_node_certificate_even_under_a_control_planes_name(
    planes: dict[str, Plane],
) -> None:
    request = RelayRequest(method="GET", path="/api/status")
    with pytest.raises(Unauthorized, match="'cp2' is a node's"):
        await anext(planes["cp1"].answering.answer(RelayPeer("cp2", control_plane=False), request))


async def test_a_standby_refuses_to_answer_a_relay(planes: dict[str, Plane]) -> None:
    request = RelayRequest(method="GET", path="/api/status")
    with pytest.raises(NotLeader):
        await anext(planes["cp2"].answering.answer(RelayPeer("cp1", control_plane=True), request))


async def test_a_standby_holds_a_request_while_no_one_leads_and_serves_it_once_it_leads(
    planes: dict[str, Plane],
) -> None:
    async def unreachable(address: str, request: RelayRequest, connect_s: float) -> AsyncIterator[RelayChunk]:
        raise ChannelClosed(f"cannot reach the control plane at {address}", "waiting")
        yield RelayChunk()  # pragma: no cover - makes this a generator

    cp2 = planes["cp2"]
    front = StandbyForwarding(cp2.app, cp2.leadership, unreachable, 10)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=front),
        base_url="http://cp2",
        headers={"Authorization": f"Bearer {TOKEN}"},
    ) as client:
        pending = asyncio.create_task(client.get("/api/status"))
        await asyncio.sleep(0.05)
        assert not pending.done()
        await planes["cp1"].leadership.resign()
        await cp2.leadership.round()
        answer = await asyncio.wait_for(pending, 5)
    assert answer.status_code == 200
    assert answer.json()["name"] == answer.json()["leader"] == "cp2"


async def test_a_standby_answers_503_when_no_one_leads_within_the_wait(planes: dict[str, Plane]) -> None:
    async def unreachable(address: str, request: RelayRequest, connect_s: float) -> AsyncIterator[RelayChunk]:
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


async def _local(plane: Plane, method: str, path: str, body: Any = None) -> Any:
    request = RelayRequest(
        method=method,
        path=path,
        headers=(("authorization", f"Bearer {TOKEN}"),)
        + ((("content-type", "application/json"),) if body is not None else ()),
        body=json.dumps(body).encode() if body is not None else b"",
    )
    chunks = [chunk async for chunk in call_app(plane.app, request)]
    assert chunks[0].status < 400, chunks[0]
    return json.loads(b"".join(c.data for c in chunks))


def test_a_floating_address_is_local_only_where_it_is_bound() -> None:
    assert address_is_local("127.0.0.1")
    assert not address_is_local("192.0.2.77/32")  # TEST-NET-1: on no interface here
