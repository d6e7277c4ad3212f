"""The control plane's firewall part, read from the store: settings, nodes, control planes (C10.2)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.controlplane.nodes.firewalling import server_source
from llmgw.core.settingtypes import FIREWALL_ENABLED, FIREWALL_NETWORKS
from llmgw.store.database import Store
from llmgw.store.leases import Leases


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    yield opened
    await opened.close()


async def _resolve(host: str) -> list[str]:
    return {"gpu1.lan": ["10.0.0.11"]}.get(host, [host])


async def test_the_agent_port_lets_in_every_node_and_control_plane_the_store_knows(store: Store) -> None:
    source = server_source(store, "cp1", ("10.0.0.1", 8080), ("10.0.0.1", 8443), _resolve)
    assert (await source()).rules[1].sources == ()  # nobody known yet: loopback only
    await store.nodes.upsert("gpu1", "gpu1.lan", {})
    await store.nodes.upsert("gpu2", "10.0.0.12", {})
    await Leases(store).announce("cp2", "10.0.0.2:8443", "http://10.0.0.2:8080")
    part = await source()
    http, agents = part.rules
    assert http.anywhere and http.first == 8080
    assert agents.sources == ("10.0.0.2", "10.0.0.11", "10.0.0.12")
    assert part.name == "server-cp1" and part.enabled


async def test_the_settings_turn_it_off_and_narrow_http(store: Store) -> None:
    source = server_source(store, "cp1", ("10.0.0.1", 8080), ("10.0.0.1", 8443), _resolve)
    await store.settings.set(FIREWALL_NETWORKS, ["192.168.0.0/16"], "admin")
    assert (await source()).rules[0].sources == ("192.168.0.0/16",)
    await store.settings.set(FIREWALL_ENABLED, False, "admin")
    part = await source()
    assert not part.enabled and part.rules == ()
