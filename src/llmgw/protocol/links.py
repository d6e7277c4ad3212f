"""Each side of an agent's stream in core messages: a wire channel with its codec at the edge.

A transport (gRPC, or the in-memory pair in tests) carries the protocol's
messages; :func:`agent_link` and :func:`control_link` wrap one side so the
agent and the control plane send and receive the core types of
:mod:`llmgw.core.agentstream` and never touch a wire message. A message of a
kind this side does not know (a newer peer's) is logged and skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Generic, TypeVar

from llmgw.core.agentstream import AgentMessage, ControlMessage
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol.channels import AgentChannel, Channel, ControlChannel
from llmgw.protocol.messages import (
    decode_agent_message,
    decode_control_message,
    encode_agent_message,
    encode_control_message,
)

log = logging.getLogger(__name__)

Out = TypeVar("Out")
In = TypeVar("In")
WireOut = TypeVar("WireOut")
WireIn = TypeVar("WireIn")


class Link(Generic[Out, In, WireOut, WireIn]):
    """One side of a stream that speaks core messages over a wire channel."""

    def __init__(
        self,
        wire: Channel[WireOut, WireIn],
        encode: Callable[[Out], WireOut],
        decode: Callable[[WireIn], In | None],
    ) -> None:
        self.wire = wire
        """The transport's channel underneath."""
        self._encode = encode
        self._decode = decode

    @property
    def peer(self) -> str:
        return self.wire.peer

    async def send(self, message: Out) -> None:
        await self.wire.send(self._encode(message))

    async def receive(self) -> In:
        while True:
            decoded = self._decode(await self.wire.receive())
            if decoded is not None:
                return decoded
            log.info("ignoring a message from %s of a kind this version does not know", self.peer)

    async def close(self) -> None:
        await self.wire.close()


AgentLink = Link[AgentMessage, ControlMessage, pb.AgentMessage, pb.ControlMessage]
"""The agent's side of its stream, in core messages."""
ControlLink = Link[ControlMessage, AgentMessage, pb.ControlMessage, pb.AgentMessage]
"""The control plane's side of a node's stream, in core messages."""


def agent_link(channel: AgentChannel) -> AgentLink:
    return Link(channel, encode_agent_message, decode_control_message)


def control_link(channel: ControlChannel) -> ControlLink:
    return Link(channel, encode_control_message, decode_agent_message)
