"""The gateway state stream over real gRPC with mutual TLS: the state protocol's frames both ways, as
sent, the caller named by its certificate, refusals before anything is sent, and either side's close
ending the stream for both.

The leader's side is a handler here (the control plane's is
``controlplane/statesharing/statestream.py``, tested in memory in
tests/controlplane/test_state_stream.py); the frames are opaque to the channel
(``controlplane/statesharing/stateevents.py`` reads them).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from llmgw.core.relays import RelayPeer
from llmgw.errors import ChannelClosed, NotLeader, Unauthorized
from llmgw.protocol.channels import StateChannel
from llmgw.protocol.grpc_client import GrpcConnector
from llmgw.protocol.grpc_transport import AgentServer

from .cluster_pki import Pki

WAIT_S = 10.0
"""Bound on waits that must end promptly; only reached when a test fails."""


class Leader:
    """Sends a copy, then echoes what the standby sends; refuses nodes, and everyone when not leading."""

    def __init__(self) -> None:
        self.peers: list[RelayPeer] = []
        self.leading = True
        self.ended = asyncio.Event()

    async def __call__(self, peer: RelayPeer, channel: StateChannel) -> None:
        self.peers.append(peer)
        if not peer.control_plane:
            raise Unauthorized(f"the certificate {peer.name!r} is a node's", "only control planes follow")
        if not self.leading:
            raise NotLeader("cp1 does not lead", "ask the leader")
        await channel.send(b'{"v":1,"kind":"copy","replica_ids":["r1"]}')
        await channel.send(b'{"v":1,"kind":"live"}')
        try:
            while True:
                got = await channel.receive()
                await channel.send(b"echo " + got)
        except ChannelClosed:
            self.ended.set()


async def no_session(channel: object) -> None:
    return


async def no_blobs(peer: RelayPeer, sha256: str, offset: int) -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover - makes this a generator


@pytest.fixture
async def leader() -> Leader:
    return Leader()


@pytest.fixture
async def target(pki: Pki, leader: Leader) -> AsyncIterator[str]:
    server = AgentServer(no_session, no_blobs, pki.server, "127.0.0.1", 0, state=leader)
    port = await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop()


async def receive(channel: StateChannel) -> bytes:
    return await asyncio.wait_for(channel.receive(), WAIT_S)


async def test_a_control_plane_gets_the_stream_and_both_ways_carry_the_frames_as_sent(
    pki: Pki, target: str, leader: Leader
) -> None:
    channel = await GrpcConnector(target, pki.server).gateway_state(WAIT_S)
    assert await receive(channel) == b'{"v":1,"kind":"copy","replica_ids":["r1"]}'
    assert await receive(channel) == b'{"v":1,"kind":"live"}'
    await channel.send(b'{"v":1,"kind":"wanted","model":"m"}')
    assert await receive(channel) == b'echo {"v":1,"kind":"wanted","model":"m"}'
    await channel.send(b"\x00 not a frame the codec reads \n")  # the channel carries any bytes
    assert await receive(channel) == b"echo \x00 not a frame the codec reads \n"
    assert leader.peers == [RelayPeer("cp1", control_plane=True)]
    await channel.close()
    await asyncio.wait_for(leader.ended.wait(), WAIT_S)  # the standby's close ends the leader's side
    with pytest.raises(ChannelClosed):
        await channel.send(b'{"v":1,"kind":"wanted","model":"m"}')


async def test_a_nodes_certificate_is_refused_before_anything_is_sent(pki: Pki, target: str) -> None:
    channel = await GrpcConnector(target, pki.node).gateway_state(WAIT_S)
    with pytest.raises(ChannelClosed, match=r"PERMISSION_DENIED.*is a node's"):
        await receive(channel)
    await channel.close()


async def test_a_plane_that_does_not_lead_refuses_the_stream(pki: Pki, target: str, leader: Leader) -> None:
    leader.leading = False
    channel = await GrpcConnector(target, pki.server).gateway_state(WAIT_S)
    with pytest.raises(ChannelClosed, match=r"FAILED_PRECONDITION.*does not lead"):
        await receive(channel)
    await channel.close()


async def test_the_leader_going_away_ends_the_standbys_stream(pki: Pki, leader: Leader) -> None:
    server = AgentServer(no_session, no_blobs, pki.server, "127.0.0.1", 0, state=leader)
    port = await server.start()
    channel = await GrpcConnector(f"127.0.0.1:{port}", pki.server).gateway_state(WAIT_S)
    assert b'"copy"' in await receive(channel)
    await server.stop()
    with pytest.raises(ChannelClosed):
        while True:
            await receive(channel)
    await channel.close()


async def test_an_unreachable_leader_is_channel_closed_within_the_connect_wait(pki: Pki) -> None:
    with pytest.raises(ChannelClosed, match="cannot reach"):
        await GrpcConnector("127.0.0.1:1", pki.server).gateway_state(0.5)
