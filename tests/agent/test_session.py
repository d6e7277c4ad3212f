"""The agent's session follows leadership: standbys point it on, the leader tells it every control plane."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.agent.config import ShardSettings
from llmgw.agent.session import AgentSession
from llmgw.agent.supervising import ShardSupervisor
from llmgw.core.backoff import Backoff
from llmgw.core.devices import NodeInventory
from llmgw.errors import ChannelClosed
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol.channels import MemoryChannel, memory_pair
from llmgw.testing.eventually import eventually

ControlSide = MemoryChannel[pb.ControlMessage, pb.AgentMessage]


class Planes:
    """Control planes by address; each connection hands its control side to the test."""

    def __init__(self, down: set[str] | None = None) -> None:
        self.down = down or set()
        self.failures: dict[str, int] = {}
        """Connections to refuse per address before answering."""
        self.attempts: list[str] = []
        self.sessions: asyncio.Queue[tuple[str, ControlSide]] = asyncio.Queue()

    async def connect(self, target: str) -> MemoryChannel[pb.AgentMessage, pb.ControlMessage]:
        self.attempts.append(target)
        if self.failures.get(target, 0) > 0:
            self.failures[target] -= 1
            raise ChannelClosed(f"cannot reach the control plane at {target}", "retrying")
        if target in self.down:
            raise ChannelClosed(f"cannot reach the control plane at {target}", "retrying")
        agent, control = memory_pair("node1")
        await self.sessions.put((target, control))
        return agent

    async def next(self) -> tuple[str, ControlSide]:
        async with asyncio.timeout(5):
            target, control = await self.sessions.get()
            first = await control.receive()
            assert first.WhichOneof("kind") == "register"
            return target, control


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[tuple[AgentSession, Planes]]:
    planes = Planes(down={"cp3:8443"})

    async def prepare(*args: object) -> None:
        raise AssertionError("no shard is started in these tests")

    supervisor = ShardSupervisor(tmp_path, ShardSettings(), prepare)  # type: ignore[arg-type]
    session = AgentSession(
        NodeInventory("node1", "127.0.0.1", 4, 8192),
        supervisor,
        ["cp2:8443"],
        planes.connect,
        backoff=Backoff(base=0.001, factor=2.0, cap=0.01),
        standby_retry_s=0.001,
    )
    task = asyncio.create_task(session.run())
    yield session, planes
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def registered(
    leader: str, planes: list[str], *, standby: bool = False, address: str = ""
) -> pb.ControlMessage:
    return pb.ControlMessage(
        registered=pb.Registered(
            leader=leader, control_planes=planes, standby=standby, leader_address=address
        )
    )


async def test_a_standby_points_the_agent_to_the_leader(running: tuple[AgentSession, Planes]) -> None:
    session, planes = running
    target, control = await planes.next()
    assert target == "cp2:8443"
    await control.send(registered("cp1", ["cp1:8443", "cp2:8443"], standby=True, address="cp1:8443"))
    target, control = await planes.next()
    assert target == "cp1:8443"
    await control.send(registered("cp1", ["cp1:8443", "cp2:8443", "cp3:8443"]))
    async with asyncio.timeout(5):
        await session.connected.wait()
    assert (session.current, session.leader) == ("cp1:8443", "cp1")
    assert session.control_planes == ["cp2:8443", "cp1:8443", "cp3:8443"]


async def test_without_a_leader_the_agent_asks_the_standby_again(
    running: tuple[AgentSession, Planes],
) -> None:
    session, planes = running
    for _ in range(3):
        target, control = await planes.next()
        assert target == "cp2:8443"
        await control.send(registered("", ["cp2:8443"], standby=True))
    target, control = await planes.next()
    await control.send(registered("cp2", ["cp2:8443"]))
    async with asyncio.timeout(5):
        await session.connected.wait()
    assert session.current == "cp2:8443"


async def test_the_backoff_starts_again_after_a_session_that_worked(
    running: tuple[AgentSession, Planes],
) -> None:
    session, planes = running
    _, control = await planes.next()
    await control.send(registered("cp2", ["cp2:8443"]))
    async with asyncio.timeout(5):
        await session.connected.wait()
    planes.failures["cp2:8443"] = 4
    await control.close()  # the control plane restarts: four refused tries, then it answers
    _, control = await planes.next()
    await control.send(registered("cp2", ["cp2:8443"]))
    async with asyncio.timeout(5):
        await session.connected.wait()
    assert session._backoff.attempts == 5  # one after the session, four refusals
    await control.close()
    _, control = await planes.next()  # this session worked: the backoff starts again
    assert session._backoff.attempts == 1


async def test_a_standby_naming_the_leader_that_just_died_is_not_believed(
    running: tuple[AgentSession, Planes],
) -> None:
    session, planes = running
    _, control = await planes.next()
    await control.send(registered("cp2", ["cp2:8443", "cp3:8443"]))
    async with asyncio.timeout(5):
        await session.connected.wait()
    await control.close()  # cp2 led and died; cp3 stands by, its lease record still naming cp2
    planes.failures["cp2:8443"] = 1000
    planes.down.discard("cp3:8443")
    for _ in range(3):
        target, control = await planes.next()
        assert target == "cp3:8443"
        await control.send(registered("cp2", ["cp2:8443", "cp3:8443"], standby=True, address="cp2:8443"))
    target, control = await planes.next()
    assert target == "cp3:8443"  # asked the standby again rather than the dead leader
    await control.send(registered("cp3", ["cp2:8443", "cp3:8443"]))
    async with asyncio.timeout(5):
        await session.connected.wait()
    assert session.current == "cp3:8443"


async def test_a_standby_without_a_leader_is_asked_again_later_each_time_and_with_jitter(
    tmp_path: Path,
) -> None:
    planes = Planes()
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)
        await asyncio.sleep(0)

    async def prepare(*args: object) -> None:
        raise AssertionError("no shard is started in these tests")

    draws = iter([0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    session = AgentSession(
        NodeInventory("node1", "127.0.0.1", 4, 8192),
        ShardSupervisor(tmp_path, ShardSettings(), prepare),  # type: ignore[arg-type]
        ["cp2:8443"],
        planes.connect,
        sleep=sleep,
        standby_backoff=Backoff(base=0.5, factor=2.0, cap=1.5, jitter=0.5, draw=lambda: next(draws)),
    )
    task = asyncio.create_task(session.run())
    try:
        for _ in range(4):  # no leader yet: 0.5 s, 1 s shortened by half, then the cap
            _, control = await planes.next()
            await control.send(registered("", ["cp2:8443", "cp3:8443"], standby=True))
        _, control = await planes.next()  # the standby leads now elsewhere: the agent goes there at once
        await control.send(registered("cp3", ["cp2:8443", "cp3:8443"], standby=True, address="cp3:8443"))
        target, control = await planes.next()
        assert target == "cp3:8443"
        assert slept == [0.5, 0.5, 1.5, 1.5]
        await control.send(registered("", ["cp2:8443", "cp3:8443"], standby=True))  # it lost the lease
        await planes.next()
        assert slept == [0.5, 0.5, 1.5, 1.5, 0.5]  # the delays start again once pointed on
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_registration_left_unanswered_is_given_up_and_tried_again(tmp_path: Path) -> None:
    planes = Planes()

    async def prepare(*args: object) -> None:
        raise AssertionError("no shard is started in these tests")

    session = AgentSession(
        NodeInventory("node1", "127.0.0.1", 4, 8192),
        ShardSupervisor(tmp_path, ShardSettings(), prepare),  # type: ignore[arg-type]
        ["cp2:8443"],
        planes.connect,
        backoff=Backoff(base=0.001, factor=2.0, cap=0.01),
        answer_timeout_s=0.01,
    )
    task = asyncio.create_task(session.run())
    try:
        _, silent = await planes.next()  # never answers
        _, control = await planes.next()  # the agent gave up on it and asked again
        await control.send(registered("cp2", ["cp2:8443"]))
        async with asyncio.timeout(5):
            await session.connected.wait()
        with pytest.raises(ChannelClosed):
            await asyncio.wait_for(silent.receive(), 5)  # the agent closed the silent stream
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_agent_learns_a_control_plane_that_joins_mid_session(
    running: tuple[AgentSession, Planes],
) -> None:
    session, planes = running
    _, control = await planes.next()
    await control.send(registered("cp2", ["cp2:8443"]))
    async with asyncio.timeout(5):
        await session.connected.wait()
    await control.send(registered("cp2", ["cp2:8443", "cp4:8443"]))
    await eventually(lambda: "cp4:8443" in session.control_planes, message="the session learns of cp4")
    assert session.control_planes == ["cp2:8443", "cp4:8443"]


class EndingAsCancelled:
    """The agent's side of a stream that ends in the very step its session is told to stop."""

    def __init__(self, channel: MemoryChannel[pb.AgentMessage, pb.ControlMessage]) -> None:
        self.channel = channel
        self.received = 0

    async def send(self, message: pb.AgentMessage) -> None:
        await self.channel.send(message)

    async def receive(self) -> pb.ControlMessage:
        self.received += 1
        if self.received == 1:
            return await self.channel.receive()  # the registration's answer
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # the agent stops (SIGTERM) ...
        raise ChannelClosed("the stream ended", "the control plane stopped")  # ... as the leader stops

    async def close(self) -> None:
        await self.channel.close()


async def test_a_session_told_to_stop_as_its_stream_ends_stops(tmp_path: Path) -> None:
    attempts: list[str] = []

    async def connect(target: str) -> EndingAsCancelled:
        attempts.append(target)
        agent, control = memory_pair("node1")
        await control.send(pb.ControlMessage(registered=pb.Registered(leader="cp1", control_planes=[target])))
        return EndingAsCancelled(agent)

    async def prepare(*args: object) -> None:
        raise AssertionError("no shard is started in these tests")

    supervisor = ShardSupervisor(tmp_path, ShardSettings(), prepare)  # type: ignore[arg-type]
    session = AgentSession(
        NodeInventory("node1", "127.0.0.1", 4, 8192), supervisor, ["cp1:8443"], connect,  # type: ignore[arg-type]
        backoff=Backoff(base=0.001, factor=2.0, cap=0.01),
    )  # fmt: skip
    task = asyncio.create_task(session.run())
    done, _ = await asyncio.wait({task}, timeout=5)
    if task not in done:
        task.cancel()  # (once more: the first was lost)
    assert task in done and task.cancelled(), f"the session went on: {len(attempts)} connections"
