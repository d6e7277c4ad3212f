"""What every stream must do: written once, run against each implementation of the channel.

An implementation (the in-memory pair, gRPC with mutual TLS, the Unix socket
of :mod:`llmgw.protocol.unix_transport`, or a new one) is checked by handing
:func:`run_check` a factory of connected :class:`Pair` s, once per entry of
:data:`CHECKS`::

    @pytest.mark.parametrize("check", CHECKS, ids=str)
    async def test_memory_channels_keep_the_contract(check: Check) -> None:
        await run_check(check, memory_pairs)

The contract, as :mod:`llmgw.protocol.channels` states it:

- what one side sends arrives at the other, in order, both ways, sends made
  at once by several tasks included (in the order they were made);
- ``peer`` names the other end;
- ``close`` ends the stream for both sides: a ``receive`` on either side,
  waiting or to come, raises :class:`~llmgw.errors.ChannelClosed` (after the
  messages the other side sent before it closed), and so does any later
  ``send`` on the side that closed or on a side that has seen the end;
- ``close`` may be called again, on either side, and does nothing more.
"""

from __future__ import annotations

import asyncio
import base64
import os
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from llmgw.errors import ChannelClosed
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol.channels import AgentChannel, ControlChannel, memory_pair
from llmgw.protocol.unix_transport import UnixChannel, UnixServer, connect_unix, private_unix_socket

WAIT_S = 5.0
"""Bound on a wait that must end promptly; only reached when an implementation breaks the contract."""

Side = Literal["agent", "control"]


@dataclass
class Pair:
    """Two connected sides of one stream, and the names each should give its peer."""

    agent: AgentChannel
    control: ControlChannel
    agent_name: str
    """What the control side's ``peer`` says (the node's certificate name, a test's label)."""
    control_name: str
    """What the agent side's ``peer`` says."""


PairFactory = Callable[[], AbstractAsyncContextManager[Pair]]
"""Opens one connected pair and cleans up after it (closing both sides, stopping a server)."""


def up(n: int) -> pb.AgentMessage:
    return pb.AgentMessage(heartbeat=pb.Heartbeat(sent_unix_ms=n))


def down(n: int) -> pb.ControlMessage:
    return pb.ControlMessage(heartbeat=pb.Heartbeat(sent_unix_ms=n))


class _Ends:
    """One side of a pair as ``closing`` and the other as ``other``, with a message each may send."""

    def __init__(self, pair: Pair, closer: Side) -> None:
        self.closing: AgentChannel | ControlChannel
        self.other: AgentChannel | ControlChannel
        if closer == "agent":
            self.closing, self.other = pair.agent, pair.control
        else:
            self.closing, self.other = pair.control, pair.agent
        self.closer = closer

    async def send_from_closing(self, n: int) -> None:
        await (self.closing.send(up(n)) if self.closer == "agent" else self.closing.send(down(n)))  # type: ignore[arg-type]

    async def send_from_other(self, n: int) -> None:
        await (self.other.send(down(n)) if self.closer == "agent" else self.other.send(up(n)))  # type: ignore[arg-type]


async def _ended(receive: Awaitable[object], what: str) -> None:
    """``receive`` raises ChannelClosed promptly (and delivers nothing)."""
    try:
        got = await asyncio.wait_for(receive, WAIT_S)
    except ChannelClosed:
        return
    except TimeoutError:
        raise AssertionError(
            f"{what}: still waiting after {WAIT_S:g} s instead of raising ChannelClosed"
        ) from None
    raise AssertionError(f"{what}: received {got!r} instead of raising ChannelClosed")


async def _refused(send: Awaitable[None], what: str) -> None:
    try:
        await asyncio.wait_for(send, WAIT_S)
    except ChannelClosed:
        return
    raise AssertionError(f"{what}: the send went through instead of raising ChannelClosed")


async def _stamps(receives: list[Awaitable[pb.AgentMessage | pb.ControlMessage]]) -> list[int]:
    return [(await asyncio.wait_for(r, WAIT_S)).heartbeat.sent_unix_ms for r in receives]


# The checks: each one behaviour of the contract.


async def messages_from_the_agent_arrive_in_order(pair: Pair) -> None:
    for n in range(5):
        await pair.agent.send(up(n))
    assert await _stamps([pair.control.receive() for _ in range(5)]) == [0, 1, 2, 3, 4]


async def messages_from_the_control_plane_arrive_in_order(pair: Pair) -> None:
    for n in range(5):
        await pair.control.send(down(n))
    assert await _stamps([pair.agent.receive() for _ in range(5)]) == [0, 1, 2, 3, 4]


async def messages_cross_both_ways_at_once(pair: Pair) -> None:
    await pair.agent.send(up(1))
    await pair.control.send(down(2))
    assert await _stamps([pair.control.receive()]) == [1]
    assert await _stamps([pair.agent.receive()]) == [2]


async def sends_made_at_once_all_arrive_in_the_order_made(pair: Pair) -> None:
    """Many tasks send on one side at the same moment (the reconciler, the session, telemetry)."""
    await asyncio.wait_for(asyncio.gather(*(pair.control.send(down(n)) for n in range(50))), WAIT_S)
    assert await _stamps([pair.agent.receive() for _ in range(50)]) == list(range(50))
    await asyncio.wait_for(asyncio.gather(*(pair.agent.send(up(n)) for n in range(50))), WAIT_S)
    assert await _stamps([pair.control.receive() for _ in range(50)]) == list(range(50))


async def each_side_names_the_other_as_its_peer(pair: Pair) -> None:
    assert (pair.agent.peer, pair.control.peer) == (pair.control_name, pair.agent_name)


async def closing_ends_the_other_sides_receive(pair: Pair, closer: Side) -> None:
    ends = _Ends(pair, closer)
    await ends.closing.close()
    await _ended(ends.other.receive(), f"the {closer} side closed; the other side's receive")


async def closing_wakes_a_receive_waiting_on_the_other_side(pair: Pair, closer: Side) -> None:
    ends = _Ends(pair, closer)
    waiting = asyncio.ensure_future(ends.other.receive())
    await asyncio.sleep(0)  # the receive starts and waits
    assert not waiting.done(), "a receive returned with nothing sent"
    await ends.closing.close()
    await _ended(waiting, f"the {closer} side closed; a receive waiting on the other side")


async def closing_wakes_a_receive_waiting_on_the_same_side(pair: Pair, closer: Side) -> None:
    ends = _Ends(pair, closer)
    waiting = asyncio.ensure_future(ends.closing.receive())
    await asyncio.sleep(0)
    assert not waiting.done(), "a receive returned with nothing sent"
    await ends.closing.close()
    await _ended(waiting, f"the {closer} side closed; a receive waiting on that side")


async def messages_sent_before_closing_are_delivered_first(pair: Pair, closer: Side) -> None:
    ends = _Ends(pair, closer)
    await ends.send_from_closing(1)
    await ends.send_from_closing(2)
    await ends.closing.close()
    assert await _stamps([ends.other.receive(), ends.other.receive()]) == [1, 2]
    await _ended(ends.other.receive(), f"after what the {closer} side sent before closing, a receive")


async def a_side_cannot_send_after_closing(pair: Pair, closer: Side) -> None:
    ends = _Ends(pair, closer)
    await ends.closing.close()
    await _refused(ends.send_from_closing(1), f"the {closer} side closed, then sent")


async def a_side_cannot_send_once_it_has_seen_the_other_close(pair: Pair, closer: Side) -> None:
    ends = _Ends(pair, closer)
    await ends.closing.close()
    await _ended(ends.other.receive(), f"the {closer} side closed; the other side's receive")
    await _refused(ends.send_from_other(1), f"the {closer} side closed; the other side sent")


async def a_closed_stream_stays_closed_to_receives_on_both_sides(pair: Pair, closer: Side) -> None:
    ends = _Ends(pair, closer)
    await ends.closing.close()
    for _ in range(3):
        await _ended(ends.other.receive(), f"the {closer} side closed; a receive on the other side")
        await _ended(ends.closing.receive(), f"the {closer} side closed; a receive on that side")


async def closing_twice_and_from_both_sides_is_harmless(pair: Pair, closer: Side) -> None:
    ends = _Ends(pair, closer)
    await ends.closing.close()
    await ends.closing.close()
    await _ended(ends.other.receive(), f"the {closer} side closed twice; the other side's receive")
    await ends.other.close()
    await ends.other.close()
    await _ended(ends.closing.receive(), "both sides closed; a receive")


@dataclass(frozen=True)
class Check:
    """One behaviour, for one closing side where it concerns closing."""

    behaviour: Callable[..., Awaitable[None]]
    closer: Side | None = None

    def __str__(self) -> str:
        name = self.behaviour.__name__
        return name if self.closer is None else f"{name}[{self.closer} closes]"


_BOTH_WAYS = (
    messages_from_the_agent_arrive_in_order,
    messages_from_the_control_plane_arrive_in_order,
    messages_cross_both_ways_at_once,
    sends_made_at_once_all_arrive_in_the_order_made,
    each_side_names_the_other_as_its_peer,
)
_PER_CLOSER = (
    closing_ends_the_other_sides_receive,
    closing_wakes_a_receive_waiting_on_the_other_side,
    closing_wakes_a_receive_waiting_on_the_same_side,
    messages_sent_before_closing_are_delivered_first,
    a_side_cannot_send_after_closing,
    a_side_cannot_send_once_it_has_seen_the_other_close,
    a_closed_stream_stays_closed_to_receives_on_both_sides,
    closing_twice_and_from_both_sides_is_harmless,
)

CHECKS: tuple[Check, ...] = (
    *(Check(behaviour) for behaviour in _BOTH_WAYS),
    *(Check(behaviour, closer) for behaviour in _PER_CLOSER for closer in ("agent", "control")),
)
"""Every behaviour of the contract; parametrise a test over these."""


async def run_check(check: Check, pairs: PairFactory) -> None:
    """Run one check on a fresh pair from ``pairs``."""
    async with pairs() as pair:
        if check.closer is None:
            await check.behaviour(pair)
        else:
            await check.behaviour(pair, check.closer)


@asynccontextmanager
async def memory_pairs() -> AsyncIterator[Pair]:
    """A pair of the in-memory implementation (:func:`~llmgw.protocol.channels.memory_pair`)."""
    agent, control = memory_pair("node-7", "cp-a")
    try:
        yield Pair(agent, control, agent_name="node-7", control_name="cp-a")
    finally:
        await agent.close()
        await control.close()


def _line(message: pb.AgentMessage | pb.ControlMessage) -> bytes:
    """A message as a frame of a Unix channel (a line: base64 holds no newline)."""
    return base64.b64encode(message.SerializeToString())


@asynccontextmanager
async def unix_pairs() -> AsyncIterator[Pair]:
    """A pair over a real Unix socket (:mod:`~llmgw.protocol.unix_transport`) in a fresh temporary
    folder, carrying the agent stream's messages as base64 lines: the connecting side is the agent's."""
    arrived: asyncio.Queue[UnixChannel[pb.ControlMessage, pb.AgentMessage]] = asyncio.Queue()
    released = asyncio.Event()

    async def session(channel: UnixChannel[pb.ControlMessage, pb.AgentMessage]) -> None:
        await arrived.put(channel)
        await released.wait()

    with tempfile.TemporaryDirectory(prefix="llmgw-unix-") as folder:
        path = Path(folder) / "channel.sock"
        server: UnixServer[pb.ControlMessage, pb.AgentMessage] = UnixServer(
            session, _line, lambda b: pb.AgentMessage.FromString(base64.b64decode(b))
        )
        await server.start(private_unix_socket(path))
        agent: UnixChannel[pb.AgentMessage, pb.ControlMessage] = await connect_unix(
            path, _line, lambda b: pb.ControlMessage.FromString(base64.b64decode(b))
        )
        try:
            control = await asyncio.wait_for(arrived.get(), WAIT_S)
            yield Pair(agent, control, agent_name=f"pid {os.getpid()}", control_name=str(path))
        finally:
            released.set()
            await agent.close()
            await server.close()
