"""``llmgw restart``'s order and waits (C10.1): agents first, then the other control planes, each
waited for; one that does not come back stops the restart, named."""

from __future__ import annotations

import pytest

from llmgw.controlplane.lifecycle.clusterrestart import ClusterRestart, Restarted, RestartTimedOut
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.core.nodes import NodeInventory, NodeRegistration, RestartAgent
from llmgw.store.leases import ControlPlaneRecord

LEASE_S = 6.0


class Agent:
    """A node's stream: RestartAgent makes the node register again (a new session), unless ``stuck``."""

    def __init__(self, fleet: Fleet, node_id: str, log: list[str], stuck: bool = False) -> None:
        self.fleet, self.node_id, self.log, self.stuck = fleet, node_id, log, stuck

    def register(self) -> None:
        self.fleet.attach(NodeRegistration(NodeInventory(self.node_id, "127.0.0.1", 4, 8192)), self)  # type: ignore[arg-type]

    async def send(self, message: object) -> None:
        assert isinstance(message, RestartAgent)
        self.log.append(f"agent {self.node_id}")
        if not self.stuck:
            self.register()


class Planes:
    """The store's control planes and their /healthz instances; a restart gives a plane a new instance
    and announces it again (unless ``stuck``)."""

    def __init__(self, log: list[str], stuck: str = "") -> None:
        self.log = log
        self.stuck = stuck
        self.records = {
            "cp1": ControlPlaneRecord("cp1", "cp1:8443", "http://cp1", 0.5),
            "cp2": ControlPlaneRecord("cp2", "cp2:8443", "http://cp2", 1.0),
            "cp3": ControlPlaneRecord("cp3", "cp3:8443", "http://cp3", 2.0),
            "old": ControlPlaneRecord("old", "old:8443", "http://old", 3 * LEASE_S + 1),
        }
        self.instances = {r.http_address: "first" for r in self.records.values()}

    async def list(self) -> list[ControlPlaneRecord]:
        return sorted(self.records.values(), key=lambda r: r.name)

    async def instance(self, http_address: str) -> str:
        return self.instances[http_address]

    async def restart(self, http_address: str, authorization: str, reason: str) -> None:
        assert authorization == "Bearer secret"
        name = http_address.removeprefix("http://")
        self.log.append(f"control-plane {name}")
        if name != self.stuck:
            self.instances[http_address] = "second"
            self.records[name] = ControlPlaneRecord(name, f"{name}:8443", http_address, 0.0)


def restart(fleet: Fleet, planes: Planes, wait_s: float = 5.0) -> ClusterRestart:
    return ClusterRestart(fleet, "cp1", planes.list, planes, lease_s=LEASE_S, wait_s=wait_s, poll_s=0.01)


def fleet_of(log: list[str], *nodes: str, stuck: str = "") -> Fleet:
    fleet = Fleet(on_ready=lambda replica, node: None, on_gone=lambda replica: None)
    for node in nodes:
        Agent(fleet, node, log, stuck=node == stuck).register()
    return fleet


async def test_agents_restart_first_then_every_other_live_control_plane_each_once_back() -> None:
    log: list[str] = []
    planes = Planes(log)
    done = await restart(fleet_of(log, "gpu2", "gpu1"), planes).run("upgrade", "Bearer secret")
    assert log == ["agent gpu1", "agent gpu2", "control-plane cp2", "control-plane cp3"]
    assert [(r.kind, r.name) for r in done] == [
        ("agent", "gpu1"),
        ("agent", "gpu2"),
        ("control-plane", "cp2"),
        ("control-plane", "cp3"),
    ]
    assert all(isinstance(r, Restarted) and r.seconds >= 0 for r in done)


async def test_an_agent_that_does_not_register_again_stops_the_restart_and_is_named() -> None:
    log: list[str] = []
    fleet = fleet_of(log, "gpu1", "gpu2", stuck="gpu1")
    with pytest.raises(RestartTimedOut, match="node gpu1 did not register again"):
        await restart(fleet, Planes(log), wait_s=0.2).run("upgrade", "Bearer secret")
    assert log == ["agent gpu1"]


async def test_a_control_plane_that_does_not_come_back_stops_the_restart_and_is_named() -> None:
    log: list[str] = []
    with pytest.raises(RestartTimedOut, match="control plane cp2 did not come back at http://cp2"):
        await restart(fleet_of(log), Planes(log, stuck="cp2"), wait_s=0.2).run("upgrade", "Bearer secret")
    assert log == ["control-plane cp2"]
