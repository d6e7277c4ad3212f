"""The admin API's settings: agents' settings checked as agent.yaml, history, the push, restarts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from llmgw.agent.config import settings_problems
from llmgw.controlplane.nodes.agentsettings import SettingsPush
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.core.devices import NodeInventory
from llmgw.core.nodes import NodeRegistration
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol.channels import AgentChannel, memory_pair
from llmgw.protocol.links import control_link
from llmgw.store.database import Store
from llmgw.testing.admin import admin_api

TOKEN = "llmgw-admin-test"


@dataclass
class Setup:
    client: httpx.AsyncClient
    fleet: Fleet
    push: SettingsPush
    store: Store

    def attach(self, node_id: str) -> AgentChannel:
        agent, control = memory_pair(node_id)
        inventory = NodeInventory(node_id=node_id, address="127.0.0.1", cpu_cores=1, memory_mb=0)
        self.fleet.attach(NodeRegistration(inventory), control_link(control))
        return agent


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    push = SettingsPush(store, fleet, delay_s=0.0)

    admin = admin_api(
        store, tmp_path, token=TOKEN, fleet=fleet, settings_push=push, check_agent_settings=settings_problems
    )
    transport = httpx.ASGITransport(app=admin.app())
    async with httpx.AsyncClient(
        transport=transport, base_url="http://cp", headers={"Authorization": f"Bearer {TOKEN}"}
    ) as client:
        yield Setup(client, fleet, push, store)
    await push.close()
    await store.close()


async def latest(channel: AgentChannel) -> pb.ControlMessage:
    """The last message a node was sent: the first within 5 s, then any that follow at once."""
    message = await asyncio.wait_for(channel.receive(), 5)
    while True:
        try:
            message = await asyncio.wait_for(channel.receive(), 0.3)
        except TimeoutError:
            return message


async def put(setup: Setup, key: str, value: object) -> httpx.Response:
    return await setup.client.put(f"/api/settings/{key}", json={"value": value})


@pytest.mark.parametrize("forbidden", ["node_id", "control_planes", "address", "tls"])
async def test_a_key_only_agent_yaml_may_set_is_refused_by_name(setup: Setup, forbidden: str) -> None:
    answer = await put(setup, "agents.default", {"shards": {"stop_grace_s": 3}, forbidden: "x"})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert [p["field"] for p in error["problems"]] == [f"agents.default.{forbidden}"]
    assert forbidden in error["message"]
    assert "agent.yaml" in error["hint"]
    assert (await setup.client.get("/api/settings")).json() == {}


async def test_unknown_and_invalid_agent_settings_are_named(setup: Setup) -> None:
    answer = await put(setup, "agents.nodes.gpu1", {"shards": {"stop_grace": 3}, "ports": {"first": 80}})
    assert answer.status_code == 400
    fields = {p["field"] for p in answer.json()["error"]["problems"]}
    assert fields == {"agents.nodes.gpu1.shards.stop_grace", "agents.nodes.gpu1.ports.first"}


async def test_agents_settings_must_be_a_mapping_under_default_or_a_node(setup: Setup) -> None:
    assert (await put(setup, "agents.default", [1, 2])).status_code == 400
    wrong = await put(setup, "agents.gpu1", {"run_as": "x"})
    assert wrong.status_code == 400
    assert "agents.nodes.<node id>" in wrong.json()["error"]["problems"][0]["problem"]


async def test_a_setting_is_kept_with_its_history(setup: Setup) -> None:
    assert (await put(setup, "agents.default", {"shards": {"stop_grace_s": 3}})).status_code == 200
    assert (await put(setup, "agents.default", {"shards": {"stop_grace_s": 4}})).status_code == 200
    got = await setup.client.get("/api/settings/agents.default")
    assert got.json() == {"key": "agents.default", "value": {"shards": {"stop_grace_s": 4}}}
    history = (await setup.client.get("/api/settings-history", params={"key": "agents.default"})).json()
    assert [h["value"]["shards"]["stop_grace_s"] for h in history] == [4, 3]
    assert (await setup.client.delete("/api/settings/agents.default")).status_code == 204
    assert (await setup.client.get("/api/settings/agents.default")).status_code == 404


async def test_each_node_gets_default_with_its_own_over_it(setup: Setup) -> None:
    gpu1 = setup.attach("gpu1")
    gpu2 = setup.attach("gpu2")
    await put(setup, "agents.default", {"shards": {"stop_grace_s": 3, "health_timeout_s": 60}})
    await put(setup, "agents.nodes.gpu1", {"shards": {"stop_grace_s": 9}})
    # both changes may come within one delay or in two pushes: the last one sent counts
    last = {"gpu1": await latest(gpu1), "gpu2": await latest(gpu2)}
    settings = {node: yaml.safe_load(message.settings.yaml) for node, message in last.items()}
    assert settings["gpu1"] == {"shards": {"stop_grace_s": 9, "health_timeout_s": 60}}
    assert settings["gpu2"] == {"shards": {"stop_grace_s": 3, "health_timeout_s": 60}}


async def test_other_settings_are_not_pushed(setup: Setup) -> None:
    node = setup.attach("gpu1")
    assert (await put(setup, "serving.stopped", True)).status_code == 200
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(node.receive(), 0.3)


async def test_restart_sends_restart_agent_to_every_connected_node(setup: Setup) -> None:
    nodes = {name: setup.attach(name) for name in ("a", "b")}
    answer = await setup.client.post("/api/agents/restart", json={"reason": "new build"})
    assert answer.json() == {"restarted": ["a", "b"]}
    for channel in nodes.values():
        message = await asyncio.wait_for(channel.receive(), 5)
        assert message.restart.reason == "new build"


async def test_changes_within_the_delay_go_out_in_one_push(setup: Setup) -> None:
    waits: list[float] = []
    gate = asyncio.Event()

    async def sleep(delay: float) -> None:
        waits.append(delay)
        await gate.wait()

    push = SettingsPush(setup.store, setup.fleet, delay_s=1.0, sleep=sleep)
    node = setup.attach("gpu1")
    push.changed()
    push.changed()
    await asyncio.sleep(0)
    push.changed()
    assert waits == [1.0]
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(node.receive(), 0.05)
    gate.set()
    first = await asyncio.wait_for(node.receive(), 5)
    assert first.WhichOneof("kind") == "settings"
    # a change made while the delay ran is covered by the push that followed it
    assert waits == [1.0]
    push.changed()
    second = await asyncio.wait_for(node.receive(), 5)
    assert second.WhichOneof("kind") == "settings" and waits == [1.0, 1.0]
    await push.close()


async def test_the_settings_are_read_once_for_many_registrations(setup: Setup) -> None:
    now = [0.0]
    push = SettingsPush(setup.store, setup.fleet, delay_s=0.0, clock=lambda: now[0])
    await setup.store.settings.set("agents.default", {"shards": {"stop_grace_s": 3}}, "test")
    await setup.store.settings.set("agents.nodes.gpu7", {"shards": {"stop_grace_s": 9}}, "test")
    texts = await asyncio.gather(*(push.settings_of(f"gpu{n}") for n in range(10)))
    assert push.shared_reads == 1
    assert [yaml.safe_load(text)["shards"]["stop_grace_s"] for text in texts] == [3] * 7 + [9] + [3] * 2
    await setup.store.settings.set("agents.default", {"shards": {"stop_grace_s": 4}}, "test")
    push.changed()  # a change told is read at once
    assert yaml.safe_load(await push.settings_of("gpu1"))["shards"]["stop_grace_s"] == 4
    assert push.shared_reads == 2
    await setup.store.settings.set("agents.default", {"shards": {"stop_grace_s": 5}}, "test")
    assert yaml.safe_load(await push.settings_of("gpu1"))["shards"]["stop_grace_s"] == 4  # kept a while
    now[0] += 5.0  # one written elsewhere, untold, is read once what was kept is old
    assert yaml.safe_load(await push.settings_of("gpu1"))["shards"]["stop_grace_s"] == 5
    assert push.shared_reads == 3
    await push.close()


async def test_a_price_for_a_model_not_in_the_catalog_is_set_and_warned_of(setup: Setup) -> None:
    answer = await setup.client.put("/api/settings/pricing.models.nosuch", json={"value": {"input": 1}})
    assert answer.status_code == 200
    assert "no model named 'nosuch' is in the catalog" in answer.json()["warnings"][0]
    assert await setup.store.settings.get("pricing.models.nosuch") == {"input": 1}


async def test_a_negative_price_is_refused_saying_which_field(setup: Setup) -> None:
    answer = await setup.client.put("/api/settings/pricing.models.m", json={"value": {"output": -2}})
    assert answer.status_code == 400
    assert "output must be 0 or more, not -2" in answer.text
    assert await setup.store.settings.get("pricing.models.m") is None


async def test_a_currency_that_is_no_iso_code_is_refused(setup: Setup) -> None:
    answer = await setup.client.put("/api/settings/pricing.currency", json={"value": "dollars"})
    assert answer.status_code == 400
    assert "three capital letters" in answer.text
