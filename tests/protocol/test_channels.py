"""The in-memory stream: order both ways, and closing seen from either side."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.errors import ChannelClosed
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol.channels import memory_pair

WAIT_S = 2.0
"""Bound on waits that must end at once; only reached when a test fails."""


def heartbeat_up(n: int) -> pb.AgentMessage:
    return pb.AgentMessage(heartbeat=pb.Heartbeat(sent_unix_ms=n))


def heartbeat_down(n: int) -> pb.ControlMessage:
    return pb.ControlMessage(heartbeat=pb.Heartbeat(sent_unix_ms=n))


async def test_messages_from_the_agent_arrive_in_order() -> None:
    agent, control = memory_pair()
    for n in range(5):
        await agent.send(heartbeat_up(n))

    received = [await control.receive() for _ in range(5)]

    assert [m.heartbeat.sent_unix_ms for m in received] == [0, 1, 2, 3, 4]


async def test_messages_from_the_control_plane_arrive_in_order() -> None:
    agent, control = memory_pair()
    await control.send(pb.ControlMessage(registered=pb.Registered(leader="cp1")))
    await control.send(pb.ControlMessage(stop=pb.StopShard(replica_id="r1", reason="idle")))

    first, second = await agent.receive(), await agent.receive()

    assert (first.WhichOneof("kind"), first.registered.leader) == ("registered", "cp1")
    assert (second.WhichOneof("kind"), second.stop.replica_id) == ("stop", "r1")


async def test_each_side_names_the_other_as_its_peer() -> None:
    agent, control = memory_pair("node-7", "cp-a")

    assert (agent.peer, control.peer) == ("cp-a", "node-7")


@pytest.mark.parametrize("closer", ["agent", "control"])
async def test_closing_one_side_ends_the_others_receive(closer: str) -> None:
    agent, control = memory_pair()
    closing, other = (agent, control) if closer == "agent" else (control, agent)

    await closing.close()

    with pytest.raises(ChannelClosed):
        await asyncio.wait_for(other.receive(), WAIT_S)


async def test_closing_wakes_a_receive_already_waiting_on_the_other_side() -> None:
    agent, control = memory_pair()
    waiting = asyncio.create_task(control.receive())
    await asyncio.sleep(0)  # one turn of the loop: the receive starts and waits
    assert not waiting.done()

    await agent.close()

    with pytest.raises(ChannelClosed):
        await asyncio.wait_for(waiting, WAIT_S)


async def test_closing_wakes_a_receive_waiting_on_the_same_side() -> None:
    agent, _control = memory_pair()
    waiting = asyncio.create_task(agent.receive())
    await asyncio.sleep(0)  # one turn of the loop: the receive starts and waits
    assert not waiting.done()

    await agent.close()

    with pytest.raises(ChannelClosed):
        await asyncio.wait_for(waiting, WAIT_S)


async def test_messages_sent_before_closing_are_delivered_first() -> None:
    agent, control = memory_pair()
    await agent.send(heartbeat_up(1))
    await agent.close()

    delivered = await control.receive()

    assert delivered.heartbeat.sent_unix_ms == 1
    with pytest.raises(ChannelClosed):
        await control.receive()


@pytest.mark.parametrize("closer", ["agent", "control"])
async def test_a_side_cannot_send_after_closing(closer: str) -> None:
    agent, control = memory_pair()

    if closer == "agent":
        await agent.close()
        with pytest.raises(ChannelClosed):
            await agent.send(heartbeat_up(1))
    else:
        await control.close()
        with pytest.raises(ChannelClosed):
            await control.send(heartbeat_down(1))


async def test_a_side_cannot_send_once_it_has_seen_the_other_close() -> None:
    agent, control = memory_pair()
    await control.close()
    with pytest.raises(ChannelClosed):
        await agent.receive()

    with pytest.raises(ChannelClosed):
        await agent.send(heartbeat_up(1))


async def test_a_closed_side_stays_closed_to_further_receives() -> None:
    agent, control = memory_pair()
    await agent.close()

    for _ in range(3):
        with pytest.raises(ChannelClosed):
            await asyncio.wait_for(control.receive(), WAIT_S)


async def test_closing_twice_is_harmless() -> None:
    agent, control = memory_pair()
    await agent.close()
    await agent.close()
    await control.close()

    with pytest.raises(ChannelClosed):
        await asyncio.wait_for(agent.receive(), WAIT_S)
