"""The streams between llmgw's processes behind one interface: gRPC and Unix sockets in production,
in memory in tests.

A :class:`Channel` is one side of a bidirectional stream. On the agent stream
the agent's side sends :class:`AgentMessage` and receives
:class:`ControlMessage`; the control plane's side the other way round. A
:data:`StateChannel` carries the frames of the gateway state protocol
(``controlplane/statesharing/stateevents.py``) both ways: over gRPC between control planes,
over a Unix socket (:mod:`llmgw.protocol.unix_transport`) from a control
plane to its gateway workers.

The contract every implementation keeps (``llmgw.testing.channel_conformance``
checks it, for the in-memory pair, gRPC and the Unix socket):

- what one side sends arrives at the other, in order, both ways;
- ``peer`` names the other end;
- ``close`` on either side ends the stream for both: ``receive`` on either
  side, one already waiting included, raises
  :class:`~llmgw.errors.ChannelClosed` once the messages sent before the end
  are taken in; ``send`` raises it on the side that closed and on a side that
  has seen the end;
- ``close`` may be called again, on either side, and does nothing more.

Channels carry the protocol's messages: the agent and the control plane wrap
theirs in a :mod:`~llmgw.protocol.links` link and see only core types.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Generic, Protocol, TypeVar

from llmgw.errors import ChannelClosed
from llmgw.protocol import agent_pb2 as pb

Out = TypeVar("Out", contravariant=True)
In = TypeVar("In", covariant=True)


class Channel(Protocol[Out, In]):
    """One side of a stream."""

    async def send(self, message: Out) -> None: ...

    async def receive(self) -> In: ...

    async def close(self) -> None: ...

    @property
    def peer(self) -> str:
        """Who is at the other end: the certificate's common name, or a test's label."""
        ...


AgentChannel = Channel[pb.AgentMessage, pb.ControlMessage]
"""The agent's side of its stream."""
ControlChannel = Channel[pb.ControlMessage, pb.AgentMessage]
"""The control plane's side of a node's stream."""
StateChannel = Channel[bytes, bytes]
"""Either side of a gateway state stream: one frame of the state protocol
(``controlplane/statesharing/stateevents.py``, its one codec) per message, both ways."""


class BlobSource(Protocol):
    """Where an agent fetches blobs (weights) from."""

    def fetch(self, sha256: str, offset: int = 0) -> AsyncIterator[pb.BlobChunk]: ...


_CLOSED = object()
T = TypeVar("T")
U = TypeVar("U")


class MemoryChannel(Generic[T, U]):
    """One side of an in-memory stream; made in pairs by :func:`memory_pair`."""

    def __init__(self, inbox: asyncio.Queue[object], outbox: asyncio.Queue[object], peer: str) -> None:
        self._inbox = inbox
        self._outbox = outbox
        self._peer = peer
        self._closed = False

    @property
    def peer(self) -> str:
        return self._peer

    async def send(self, message: T) -> None:
        if self._closed:
            raise ChannelClosed("the stream is closed", "reconnect")
        await self._outbox.put(message)

    async def receive(self) -> U:
        if self._closed:
            raise ChannelClosed("the stream is closed", "reconnect")
        item = await self._inbox.get()
        if item is _CLOSED:
            self._closed = True
            raise ChannelClosed("the other side closed the stream", "reconnect")
        return item  # type: ignore[return-value]

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._outbox.put(_CLOSED)
            await self._inbox.put(_CLOSED)


def memory_pair(
    agent_name: str = "node", control_name: str = "control-plane"
) -> tuple[
    MemoryChannel[pb.AgentMessage, pb.ControlMessage], MemoryChannel[pb.ControlMessage, pb.AgentMessage]
]:
    """An agent side and a control side joined in memory."""
    up: asyncio.Queue[object] = asyncio.Queue()
    down: asyncio.Queue[object] = asyncio.Queue()
    agent: MemoryChannel[pb.AgentMessage, pb.ControlMessage] = MemoryChannel(down, up, control_name)
    control: MemoryChannel[pb.ControlMessage, pb.AgentMessage] = MemoryChannel(up, down, agent_name)
    return agent, control


def memory_state_pair(
    receiver: str = "standby", sender: str = "leader"
) -> tuple[MemoryChannel[bytes, bytes], MemoryChannel[bytes, bytes]]:
    """A gateway state stream's two sides joined in memory: the receiver's, then the sender's."""
    up: asyncio.Queue[object] = asyncio.Queue()
    down: asyncio.Queue[object] = asyncio.Queue()
    return MemoryChannel(down, up, sender), MemoryChannel(up, down, receiver)
