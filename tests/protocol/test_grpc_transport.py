"""The agent stream over real gRPC with mutual TLS: registration, peers, refusals, shutdown, blobs.

What every channel does (order, closing) is checked in test_channel_conformance.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from llmgw.core.relays import RelayPeer
from llmgw.errors import ChannelClosed, NotFound, Unauthorized
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol.channels import AgentChannel, ControlChannel
from llmgw.protocol.grpc_client import GrpcConnector, KeptChannels
from llmgw.protocol.grpc_transport import AgentServer, TlsFiles

from .cluster_pki import Pki

WAIT_S = 5.0
"""Bound on waits that must end promptly; only reached when a test fails."""
STOP_WITHIN_S = 2.0
"""How soon a stopped server must end an open stream."""
REFUSAL_WAIT_S = 1.0
"""How long a refused client tries to connect before giving up."""

BLOB_SHA = "ab" * 32
BLOB = bytes(range(256)) * 12_000
"""About 3 MiB: more than one chunk."""
BLOB_CHUNK = 1 << 20
HALF_BLOB_SHA = "cd" * 32
"""A blob whose provider fails after its first chunk."""
NOT_SENT_SHA = "ce" * 32
"""A blob the asking node was sent no shard with."""


@dataclass
class Sessions:
    """The server's session handler: records each peer and message, answers Register with Registered."""

    peers: list[str] = field(default_factory=list)
    received: list[pb.AgentMessage] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    end_after_first: bool = False
    """Return from the handler (end the stream) after answering the first message."""

    async def __call__(self, channel: ControlChannel) -> None:
        self.peers.append(channel.peer)
        self.started.set()
        try:
            while True:
                message = await channel.receive()
                self.received.append(message)
                if message.WhichOneof("kind") == "register":
                    node_id = message.register.node_id
                    await channel.send(pb.ControlMessage(registered=pb.Registered(leader=f"echo:{node_id}")))
                if self.end_after_first:
                    return
        except ChannelClosed:
            return
        finally:
            self.ended.set()


@dataclass
class Blobs:
    """The server's blob provider: one blob in chunks, one that fails midway, one the node was never
    sent, the rest not found."""

    asked: list[tuple[str, int]] = field(default_factory=list)
    callers: list[RelayPeer] = field(default_factory=list)

    async def __call__(self, peer: RelayPeer, sha256: str, offset: int) -> AsyncIterator[bytes]:
        self.asked.append((sha256, offset))
        self.callers.append(peer)
        if sha256 == NOT_SENT_SHA:
            raise Unauthorized(f"node {peer.name} runs no replica with the file {sha256[:12]}…", "place one")
        if sha256 == HALF_BLOB_SHA:
            yield BLOB[:BLOB_CHUNK]
            raise NotFound(f"blob {sha256} vanished")
        if sha256 != BLOB_SHA:
            raise NotFound(f"no blob {sha256} in the mirror")
        for start in range(offset, len(BLOB), BLOB_CHUNK):
            yield BLOB[start : start + BLOB_CHUNK]


Connect = Callable[[TlsFiles], Awaitable[AgentChannel]]
"""Opens an agent stream to the test's server with the given certificates."""


@pytest.fixture
def sessions() -> Sessions:
    return Sessions()


@pytest.fixture
def blobs() -> Blobs:
    return Blobs()


@pytest.fixture
async def server(pki: Pki, sessions: Sessions, blobs: Blobs) -> AsyncIterator[AgentServer]:
    agent_server = AgentServer(sessions, blobs, pki.server, "127.0.0.1", 0)
    await agent_server.start()
    yield agent_server
    await agent_server.stop()


@pytest.fixture
async def connect(server: AgentServer) -> AsyncIterator[Connect]:
    """Opens agent streams to the server; closes them after the test."""
    opened: list[AgentChannel] = []

    async def open_stream(tls: TlsFiles) -> AgentChannel:
        channel = await GrpcConnector(f"127.0.0.1:{server.port}", tls).connect(timeout_s=WAIT_S)
        opened.append(channel)
        return channel

    yield open_stream
    for channel in opened:
        await channel.close()


def register(node_id: str = "node-1") -> pb.AgentMessage:
    return pb.AgentMessage(register=pb.Register(node_id=node_id, cpu_cores=8, memory_mb=32768))


async def fetch_all(server: AgentServer, tls: TlsFiles, sha256: str, offset: int = 0) -> bytes:
    connector = GrpcConnector(f"127.0.0.1:{server.port}", tls)
    return b"".join([chunk async for chunk in connector.fetch(sha256, offset)])


async def test_start_on_port_zero_returns_the_port_it_listens_on(pki: Pki, sessions: Sessions) -> None:
    agent_server = AgentServer(sessions, Blobs(), pki.server, "127.0.0.1", 0)
    try:
        port = await agent_server.start()

        assert port > 0
        assert agent_server.port == port
    finally:
        await agent_server.stop()


async def test_register_goes_up_and_registered_comes_down(
    connect: Connect, sessions: Sessions, pki: Pki
) -> None:
    agent = await connect(pki.node)

    await agent.send(register("node-1"))
    answer = await asyncio.wait_for(agent.receive(), WAIT_S)

    assert answer.WhichOneof("kind") == "registered"
    assert answer.registered.leader == "echo:node-1"
    assert [m.register.memory_mb for m in sessions.received] == [32768]


async def test_the_server_knows_the_node_by_its_certificates_common_name(
    connect: Connect, sessions: Sessions, pki: Pki
) -> None:
    agent = await connect(pki.node)
    await agent.send(register("claims-to-be-someone-else"))
    await asyncio.wait_for(agent.receive(), WAIT_S)

    assert sessions.peers == ["node-1"]


async def test_a_client_certificate_from_another_ca_cannot_connect(
    server: AgentServer, sessions: Sessions, pki: Pki
) -> None:
    connector = GrpcConnector(f"127.0.0.1:{server.port}", pki.stranger)

    with pytest.raises(ChannelClosed, match="certificate comes from the cluster's CA"):
        await connector.connect(timeout_s=REFUSAL_WAIT_S)
    assert sessions.peers == []


async def test_a_control_plane_that_is_not_there_cannot_be_reached(server: AgentServer, pki: Pki) -> None:
    port = server.port
    await server.stop()

    with pytest.raises(ChannelClosed, match="cannot reach the control plane"):
        await GrpcConnector(f"127.0.0.1:{port}", pki.node).connect(timeout_s=REFUSAL_WAIT_S)


async def test_a_refused_connection_fails_at_once_not_at_the_timeout(server: AgentServer, pki: Pki) -> None:
    port = server.port
    await server.stop()

    async with asyncio.timeout(WAIT_S):  # the connect's own timeout is far longer
        with pytest.raises(ChannelClosed, match="cannot reach the control plane"):
            await GrpcConnector(f"127.0.0.1:{port}", pki.node).connect(timeout_s=WAIT_S * 20)


async def test_stopping_the_server_ends_an_open_stream_promptly(
    connect: Connect, server: AgentServer, sessions: Sessions, pki: Pki
) -> None:
    agent = await connect(pki.node)
    await agent.send(register())
    await asyncio.wait_for(agent.receive(), WAIT_S)

    await asyncio.wait_for(server.stop(), STOP_WITHIN_S)

    with pytest.raises(ChannelClosed):
        await asyncio.wait_for(agent.receive(), STOP_WITHIN_S)


async def test_a_session_handler_that_returns_ends_the_agents_stream(
    connect: Connect, sessions: Sessions, pki: Pki
) -> None:
    sessions.end_after_first = True
    agent = await connect(pki.node)
    await agent.send(register())
    await asyncio.wait_for(agent.receive(), WAIT_S)

    with pytest.raises(ChannelClosed, match="ended the stream"):
        await asyncio.wait_for(agent.receive(), WAIT_S)


async def test_streams_one_after_another_share_a_kept_channel(
    server: AgentServer, sessions: Sessions, pki: Pki
) -> None:
    sessions.end_after_first = True  # as a standby does: answer the registration, end the stream
    kept = KeptChannels(pki.node)
    target = f"127.0.0.1:{server.port}"
    try:
        for _ in range(3):
            agent = await kept.connect(target, timeout_s=WAIT_S)
            await agent.send(register())
            answer = await asyncio.wait_for(agent.receive(), WAIT_S)
            assert answer.registered.leader == "echo:node-1"
            await agent.close()
        assert sessions.peers == ["node-1"] * 3
        assert kept.made == 1  # one TLS handshake for the three streams
    finally:
        await kept.close()


async def test_a_kept_channel_whose_control_plane_is_gone_is_made_anew(
    server: AgentServer, sessions: Sessions, pki: Pki
) -> None:
    kept = KeptChannels(pki.node)
    target = f"127.0.0.1:{server.port}"
    try:
        agent = await kept.connect(target, timeout_s=WAIT_S)
        await agent.send(register())
        await asyncio.wait_for(agent.receive(), WAIT_S)
        await server.stop()
        with pytest.raises(ChannelClosed):
            await asyncio.wait_for(agent.receive(), WAIT_S)
        await agent.close()
        for _ in range(2):
            made = kept.made
            with pytest.raises(ChannelClosed, match="cannot reach the control plane"):
                await kept.connect(target, timeout_s=REFUSAL_WAIT_S)
        assert kept.made == made + 1  # a channel that failed is never tried again: the next try makes its own
    finally:
        await kept.close()


async def test_fetch_streams_a_blobs_bytes(server: AgentServer, blobs: Blobs, pki: Pki) -> None:
    assert await fetch_all(server, pki.node, BLOB_SHA) == BLOB
    assert blobs.asked == [(BLOB_SHA, 0)]
    assert blobs.callers == [RelayPeer("node-1", control_plane=False)], "told who asks, by its certificate"


async def test_a_control_plane_fetching_is_told_apart_from_a_node(
    server: AgentServer, blobs: Blobs, pki: Pki
) -> None:
    assert await fetch_all(server, pki.server, BLOB_SHA) == BLOB
    assert blobs.callers == [RelayPeer("cp1", control_plane=True)]


async def test_a_blob_the_node_was_never_sent_is_refused_with_the_reason(
    server: AgentServer, pki: Pki
) -> None:
    with pytest.raises(Unauthorized, match="node node-1 runs no replica with the file cececececece"):
        await fetch_all(server, pki.node, NOT_SENT_SHA)


async def test_fetch_resumes_from_an_offset(server: AgentServer, blobs: Blobs, pki: Pki) -> None:
    offset = BLOB_CHUNK + 12345

    assert await fetch_all(server, pki.node, BLOB_SHA, offset) == BLOB[offset:]
    assert blobs.asked == [(BLOB_SHA, offset)]


async def test_fetching_a_blob_the_mirror_lacks_raises_not_found(server: AgentServer, pki: Pki) -> None:
    missing = "ef" * 32

    with pytest.raises(NotFound, match=f"no blob {missing} in the mirror"):
        await fetch_all(server, pki.node, missing)


async def test_a_blob_that_fails_midway_is_not_taken_for_a_whole_one(server: AgentServer, pki: Pki) -> None:
    with pytest.raises(ChannelClosed, match="failed"):
        await fetch_all(server, pki.node, HALF_BLOB_SHA)


async def test_a_client_from_another_ca_cannot_fetch_blobs(
    server: AgentServer, blobs: Blobs, pki: Pki
) -> None:
    with pytest.raises(ChannelClosed):
        await asyncio.wait_for(fetch_all(server, pki.stranger, BLOB_SHA), WAIT_S)
    assert blobs.asked == []
