"""``GET /api/events``: server-sent events over a real HTTP server, paced by a fake clock."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.controlplane.admin.app import AdminApi
from llmgw.controlplane.admin.changes import KINDS
from llmgw.controlplane.api.events import COALESCE_S, KEEPALIVE_S
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.core.devices import NodeInventory
from llmgw.core.nodes import NodeRegistration
from llmgw.protocol.channels import memory_pair
from llmgw.store.database import Store
from llmgw.testing.admin import TOKEN, admin_api, empty_fleet
from llmgw.testing.clock import FakeClock
from llmgw.testing.eventually import eventually
from llmgw.testing.serving import serving

AUTH = {"Authorization": f"Bearer {TOKEN}"}
SETTING = "knowledge.embedding_model"


@dataclass
class Cluster:
    url: str
    admin: AdminApi
    fleet: Fleet
    clock: FakeClock


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    fleet = empty_fleet()
    clock = FakeClock()
    admin = admin_api(store, tmp_path, fleet=fleet, clock=clock)
    async with serving(admin.app()) as url:
        yield Cluster(url, admin, fleet, clock)
    await store.close()


class Events:
    """The frames of one open stream, read one at a time."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.lines = response.aiter_lines()

    async def next(self) -> tuple[str, Any]:
        """The next frame: (kind, data) for an event, ("", comment) for a comment."""
        fields: dict[str, str] = {}
        async for line in self.lines:
            if line == "":
                if fields:
                    break
                continue
            if line.startswith(":"):
                fields.setdefault("comment", line[1:].strip())
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
        if "event" in fields:
            return fields["event"], json.loads(fields["data"])
        return "", fields.get("comment", "")

    async def initial(self) -> dict[str, Any]:
        return dict([await self.next() for _ in KINDS])


async def open_events(client: httpx.AsyncClient) -> tuple[Events, Any]:
    stream = client.stream("GET", "/api/events", headers=AUTH)
    response = await stream.__aenter__()
    return Events(response), stream


async def tick(clock: FakeClock, seconds: float) -> None:
    """Move the clock once the stream waits on it (pacing or keepalive)."""
    await eventually(lambda: clock.sleepers > 0, message="the stream waiting on the clock")
    await clock.advance(seconds)


def register(fleet: Fleet, node_id: str) -> None:
    _, control = memory_pair(agent_name=node_id)
    inventory = NodeInventory(node_id=node_id, address="10.0.0.7", cpu_cores=8, memory_mb=16384)
    fleet.attach(NodeRegistration(inventory=inventory, engines=("llama.cpp b1 cpu",)), control)  # type: ignore[arg-type]


async def test_a_subscriber_first_gets_every_kind_as_its_get_route_answers(cluster: Cluster) -> None:
    async with httpx.AsyncClient(base_url=cluster.url, timeout=10) as client:
        events, stream = await open_events(client)
        try:
            assert events.response.headers["content-type"].startswith("text/event-stream")
            initial = await events.initial()
            assert list(initial) == list(KINDS)
            for kind, path in [("nodes", "/api/nodes"), ("models", "/api/models"), ("keys", "/api/keys")]:
                assert initial[kind] == (await client.get(path, headers=AUTH)).json()
            assert initial["settings"] == (await client.get("/api/settings", headers=AUTH)).json()
            assert initial["serving"] == {"stopped": False}
            assert initial["status"]["name"] == "cp1"
        finally:
            await stream.__aexit__(None, None, None)


async def test_a_node_attaching_and_a_model_added_are_sent_as_they_happen(cluster: Cluster) -> None:
    async with httpx.AsyncClient(base_url=cluster.url, timeout=10) as client:
        events, stream = await open_events(client)
        try:
            await events.initial()
            register(cluster.fleet, "gpu-1")
            await tick(cluster.clock, COALESCE_S)
            changed = dict([await events.next(), await events.next()])
            assert [n["id"] for n in changed["nodes"]] == ["gpu-1"]
            assert changed["status"]["nodes"] == 1

            sha = (
                await client.post(
                    "/api/mirror/blobs", params={"filename": "m.gguf"}, content=b"w" * 100, headers=AUTH
                )
            ).json()["sha256"]
            added = await client.post(
                "/api/models", json={"name": "m1", "source": {"sha256": sha}}, headers=AUTH
            )
            assert added.status_code == 201
            await tick(cluster.clock, COALESCE_S)
            changed = dict([await events.next(), await events.next()])
            assert [m["name"] for m in changed["models"]] == ["m1"]
            assert changed["status"]["models"] == 1
        finally:
            await stream.__aexit__(None, None, None)


async def test_changes_of_a_kind_within_half_a_second_are_one_event(cluster: Cluster) -> None:
    async with httpx.AsyncClient(base_url=cluster.url, timeout=10) as client:
        events, stream = await open_events(client)
        try:
            await events.initial()
            for value in (1, 2, 3):
                put = await client.put(f"/api/settings/{SETTING}", json={"value": f"m{value}"}, headers=AUTH)
                assert put.status_code == 200
            await tick(cluster.clock, COALESCE_S)
            assert await events.next() == ("settings", {SETTING: "m3"})
            await tick(cluster.clock, COALESCE_S)
            await tick(cluster.clock, KEEPALIVE_S)  # nothing changed since: a keepalive, no event
            assert await events.next() == ("", "keepalive")
        finally:
            await stream.__aexit__(None, None, None)


async def test_a_subscriber_that_goes_away_is_dropped(cluster: Cluster) -> None:
    changes = cluster.admin.state.changes
    async with httpx.AsyncClient(base_url=cluster.url, timeout=10) as client:
        events, stream = await open_events(client)
        await events.initial()
        assert changes.subscribers == 1
        await stream.__aexit__(None, None, None)
        await eventually(lambda: changes.subscribers == 0, message="the subscription dropped")


async def test_without_a_token_the_stream_is_refused(cluster: Cluster) -> None:
    async with httpx.AsyncClient(base_url=cluster.url, timeout=10) as client:
        answer = await client.get("/api/events")
        assert answer.status_code == 401
        assert "token" in answer.json()["error"]["hint"]


async def test_a_team_viewer_gets_only_what_its_routes_show_and_loses_the_stream_with_its_token(
    cluster: Cluster,
) -> None:
    async with httpx.AsyncClient(base_url=cluster.url, timeout=10, headers=AUTH) as admin:
        for path, body in (("/api/orgs", {"name": "acme"}), ("/api/teams", {"org": "acme", "name": "ml"})):
            assert (await admin.post(path, json=body)).status_code == 201
        assert (await admin.post("/api/users", json={"name": "vera"})).status_code == 201
        role = {"role": "viewer", "scope": "team:acme/ml"}
        assert (await admin.put("/api/users/vera/roles", json=role)).status_code == 200
        created = (await admin.post("/api/users/vera/tokens", json={"name": "t"})).json()
        vera = {"Authorization": f"Bearer {created['token']}"}
        async with admin.stream("GET", "/api/events", headers=vera) as response:
            events = Events(response)
            kinds = [(await events.next())[0] for _ in range(3)]
            assert kinds == ["models", "keys", "status"]  # no nodes, replicas, settings nor serving
            revoked = await admin.delete(f"/api/tokens/{created['id']}")
            assert revoked.status_code == 204, revoked.text
            cluster.fleet.changes.changed("models")
            await tick(cluster.clock, COALESCE_S)
            rest = [line async for line in events.lines]  # the stream ends
            assert not any(line.startswith("event:") for line in rest)


async def test_streams_end_when_the_control_plane_stops(cluster: Cluster) -> None:
    async with httpx.AsyncClient(base_url=cluster.url, timeout=10) as client:
        events, stream = await open_events(client)
        try:
            await events.initial()
            cluster.admin.state.changes.close()  # what stopping the control plane does first
            await tick(cluster.clock, COALESCE_S)
            assert [line async for line in events.lines] == []
            assert cluster.admin.state.changes.subscribers == 0
        finally:
            await stream.__aexit__(None, None, None)
