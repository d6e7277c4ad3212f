"""``firewall.enabled``: set through /api/settings, sent to every node with its settings (C10.2)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import yaml

from llmgw.agent.config import load_agent_config, settings_problems
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


class Setup:
    def __init__(self, client: httpx.AsyncClient, fleet: Fleet) -> None:
        self.client = client
        self.fleet = fleet

    def attach(self, node_id: str) -> AgentChannel:
        agent, control = memory_pair(node_id)
        inventory = NodeInventory(node_id=node_id, address="127.0.0.1", cpu_cores=1, memory_mb=0)
        self.fleet.attach(NodeRegistration(inventory), control_link(control))
        return agent

    async def put(self, key: str, value: object) -> httpx.Response:
        return await self.client.put(f"/api/settings/{key}", json={"value": value})


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
        yield Setup(client, fleet)
    await push.close()
    await store.close()


async def latest(channel: AgentChannel) -> pb.ControlMessage:
    message = await asyncio.wait_for(channel.receive(), 5)
    while True:
        try:
            message = await asyncio.wait_for(channel.receive(), 0.3)
        except TimeoutError:
            return message


async def test_turning_the_firewall_off_reaches_every_node_over_its_own_settings(setup: Setup) -> None:
    node = setup.attach("gpu1")
    assert (await setup.put("agents.default", {"shards": {"stop_grace_s": 3}})).status_code == 200
    assert (await setup.put("firewall.enabled", False)).status_code == 200
    sent = yaml.safe_load((await latest(node)).settings.yaml)
    assert sent == {"shards": {"stop_grace_s": 3}, "firewall": {"enabled": False}}


async def test_a_string_is_refused_for_firewall_enabled(setup: Setup) -> None:
    answer = await setup.put("firewall.enabled", "false")
    assert answer.status_code == 400
    assert "JSON bool" in answer.json()["error"]["problems"][0]["problem"]


async def test_a_node_reads_the_firewall_switch_from_its_settings(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"node_id": "n1", "control_planes": ["127.0.0.1:8443"]}))
    assert load_agent_config(path).firewall.enabled is True
    assert load_agent_config(path, {"firewall": {"enabled": False}}).firewall.enabled is False
    assert settings_problems({"firewall": {"enabled": "no way"}})
