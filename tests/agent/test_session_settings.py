"""The agent's session hands the control plane's Settings and RestartAgent to whoever restarts it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from llmgw.agent.config import ShardSettings
from llmgw.agent.session import AgentSession
from llmgw.agent.supervising import ShardSupervisor
from llmgw.core.devices import NodeInventory
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol.channels import AgentChannel, memory_pair


async def test_settings_and_restart_reach_their_handlers(tmp_path: Path) -> None:
    agent_side, control = memory_pair("gpu1")

    async def connect(target: str) -> AgentChannel:
        return agent_side

    async def prepare(spec: pb.StartShard) -> object:
        raise AssertionError("no shard is started here")

    settings: list[str] = []
    restarts: list[str] = []
    both = asyncio.Event()

    def on_restart(reason: str) -> None:
        restarts.append(reason)
        both.set()

    session = AgentSession(
        NodeInventory(node_id="gpu1", address="127.0.0.1", cpu_cores=1, memory_mb=1024),
        ShardSupervisor(tmp_path, ShardSettings(), prepare),  # type: ignore[arg-type]
        ["cp:1"],
        connect,
        on_settings=settings.append,
        on_restart=on_restart,
    )
    running = asyncio.create_task(session.run())
    try:
        register = await asyncio.wait_for(control.receive(), 5)
        assert register.register.node_id == "gpu1"
        await control.send(pb.ControlMessage(registered=pb.Registered(leader="cp1")))
        await control.send(pb.ControlMessage(settings=pb.Settings(yaml="run_as: ''\n")))
        await control.send(pb.ControlMessage(restart=pb.RestartAgent()))
        await asyncio.wait_for(both.wait(), 5)
    finally:
        running.cancel()
    assert settings == ["run_as: ''\n"]
    assert restarts == ["the control plane asked (RestartAgent)"]
