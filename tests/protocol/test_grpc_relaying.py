"""Relaying over real gRPC with mutual TLS: bodies stream both ways, each relay is a call of its own.

The leader's side is a handler here (the control plane's answers it with its
ASGI app, see tests/controlplane/test_relaying.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from llmgw.core.relays import IncomingRelay, RelayChunk, RelayPeer, RelayRequest
from llmgw.errors import ChannelClosed, Unauthorized
from llmgw.protocol.grpc_client import RelayClient
from llmgw.protocol.grpc_transport import MAX_MESSAGE_BYTES, AgentServer
from llmgw.protocol.relays import RELAY_CHUNK

from .cluster_pki import Pki

WAIT_S = 10.0
"""Bound on waits that must end promptly; only reached when a test fails."""
LARGE = 64 << 20
"""The body relayed each way in the large test: four times the message limit, sixteen times gRPC's default."""
PIECE = 1 << 20


def generated(size: int, seed: bytes = b"relay") -> AsyncIterator[bytes]:
    """``size`` bytes made on the fly, in pieces of :data:`PIECE` (never held whole)."""

    async def pieces() -> AsyncIterator[bytes]:
        block = hashlib.sha256(seed).digest() * (PIECE // 32)
        for start in range(0, size, PIECE):
            yield block[: min(PIECE, size - start)]

    return pieces()


async def digest(chunks: AsyncIterator[bytes]) -> tuple[int, str]:
    hashed, size = hashlib.sha256(), 0
    async for data in chunks:
        hashed.update(data)
        size += len(data)
    return size, hashed.hexdigest()


@dataclass
class Leader:
    """The leader's relay handler, answering by path; it records what it saw."""

    largest_piece: int = 0
    pieces: int = 0
    first_piece: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    answering: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    cut_off: asyncio.Event = field(default_factory=asyncio.Event)

    async def _body(self, incoming: IncomingRelay) -> AsyncIterator[bytes]:
        try:
            async for data in incoming.body():
                self.pieces += 1
                self.largest_piece = max(self.largest_piece, len(data))
                self.first_piece.set()
                yield data
        except ChannelClosed:
            self.cut_off.set()
            raise

    async def __call__(self, peer: RelayPeer, incoming: IncomingRelay) -> AsyncIterator[RelayChunk]:
        if peer.name != "cp1":
            raise Unauthorized(f"the certificate {peer.name!r} is a node's", "only control planes relay")
        request = await incoming.head()
        path, _, query = request.path.partition("?")
        if path == "/digest":
            size, sha = await digest(self._body(incoming))
            yield RelayChunk(200, (("content-type", "application/json"),), json.dumps([size, sha]).encode())
        elif path == "/generate":
            yield RelayChunk(200, (("x-size", query),))
            size = int(query)
            yield RelayChunk(data=b"\x01" * min(size, 3 * MAX_MESSAGE_BYTES // 2))  # one write over the limit
            async for data in generated(size - min(size, 3 * MAX_MESSAGE_BYTES // 2)):
                yield RelayChunk(data=data)
        elif path == "/fail-midway":
            yield RelayChunk(200, data=b"first")
            raise RuntimeError("the app failed mid-answer")
        elif path == "/hold":
            yield RelayChunk(200, data=b"first")
            self.answering.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
            yield RelayChunk(data=b"second")
        elif path == "/read-slowly":
            async for _ in self._body(incoming):
                pass
            yield RelayChunk(200, data=b"read")


@pytest.fixture
async def leader() -> Leader:
    return Leader()


@pytest.fixture
async def target(pki: Pki, leader: Leader) -> AsyncIterator[str]:
    async def no_session(channel: object) -> None:
        return

    async def no_blobs(peer: RelayPeer, sha256: str, offset: int) -> AsyncIterator[bytes]:
        return
        yield b""  # pragma: no cover - makes this a generator

    server = AgentServer(no_session, no_blobs, pki.server, "127.0.0.1", 0, relay=leader)
    port = await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop()


@pytest.fixture
async def relays(pki: Pki) -> AsyncIterator[RelayClient]:
    client = RelayClient(pki.server)
    yield client
    await client.close()


async def answer_of(
    relays: RelayClient, target: str, path: str, body: AsyncIterator[bytes] | None = None
) -> list[RelayChunk]:
    return [chunk async for chunk in relays.relay(target, RelayRequest("POST", path), body, WAIT_S)]


async def test_a_large_body_streams_to_the_leader_in_pieces_under_the_message_limit(
    relays: RelayClient, target: str, leader: Leader
) -> None:
    chunks = await asyncio.wait_for(answer_of(relays, target, "/digest", generated(LARGE)), WAIT_S * 3)

    assert json.loads(chunks[0].data) == list(await digest(generated(LARGE)))
    assert leader.largest_piece <= RELAY_CHUNK
    assert leader.pieces >= LARGE // RELAY_CHUNK


async def test_a_large_answer_streams_back_even_one_written_past_the_message_limit(
    relays: RelayClient, target: str
) -> None:
    stream = relays.relay(target, RelayRequest("GET", f"/generate?{LARGE}"), None, WAIT_S)
    first = await asyncio.wait_for(anext(stream), WAIT_S)
    size = len(first.data)
    largest = 0
    async for chunk in stream:
        size += len(chunk.data)
        largest = max(largest, len(chunk.data))

    assert (first.status, first.headers) == (200, (("x-size", str(LARGE)),))
    assert size == LARGE
    assert largest <= RELAY_CHUNK


async def test_the_body_reaches_the_leader_while_the_client_still_sends_it(
    relays: RelayClient, target: str, leader: Leader
) -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b"x" * 1000
        await leader.first_piece.wait()  # held whole, the body would never get here
        yield b"y" * 1000

    chunks = await asyncio.wait_for(answer_of(relays, target, "/digest", body()), WAIT_S)

    assert json.loads(chunks[0].data)[0] == 2000


async def test_a_relay_failing_midway_ends_no_other_on_the_same_channel(
    relays: RelayClient, target: str, leader: Leader
) -> None:
    holding = asyncio.create_task(answer_of(relays, target, "/hold"))
    await asyncio.wait_for(leader.answering.wait(), WAIT_S)

    with pytest.raises(ChannelClosed, match="failed"):
        await asyncio.wait_for(answer_of(relays, target, "/fail-midway"), WAIT_S)
    leader.release.set()

    assert [c.data for c in await asyncio.wait_for(holding, WAIT_S)] == [b"first", b"second"]
    assert (await answer_of(relays, target, "/digest"))[0].status == 200


async def test_a_relay_left_by_its_caller_is_cancelled_at_the_leader_and_ends_no_other(
    relays: RelayClient, target: str, leader: Leader
) -> None:
    left = asyncio.create_task(answer_of(relays, target, "/hold"))
    await asyncio.wait_for(leader.answering.wait(), WAIT_S)
    left.cancel()

    await asyncio.wait_for(leader.cancelled.wait(), WAIT_S)
    assert (await asyncio.wait_for(answer_of(relays, target, "/digest", generated(3 * PIECE)), WAIT_S))[
        0
    ].status == 200


async def test_a_body_that_fails_cancels_the_call_and_its_error_reaches_the_caller(
    relays: RelayClient, target: str, leader: Leader
) -> None:
    class ClientGone(Exception):
        pass

    async def body() -> AsyncIterator[bytes]:
        yield b"x" * 1000
        await leader.first_piece.wait()
        raise ClientGone("the client went away")

    with pytest.raises(ClientGone):
        await asyncio.wait_for(answer_of(relays, target, "/read-slowly", body()), WAIT_S)
    await asyncio.wait_for(leader.cut_off.wait(), WAIT_S)


async def test_the_leader_refusing_a_certificate_is_unauthorized(pki: Pki, target: str) -> None:
    node = RelayClient(pki.node)
    try:
        with pytest.raises(Unauthorized, match="'node-1' is a node's"):
            await asyncio.wait_for(answer_of(node, target, "/digest"), WAIT_S)
    finally:
        await node.close()


async def test_concurrent_relays_to_a_dead_leader_each_end_in_channel_closed(relays: RelayClient) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"

    async def one(connect_s: float) -> BaseException | None:
        try:
            async for _ in relays.relay(dead, RelayRequest("POST", "/api/keys"), generated(10), connect_s):
                pass
        except Exception as error:
            return error
        return None

    outcomes = await asyncio.wait_for(asyncio.gather(*(one(0.2 + i * 0.1) for i in range(5))), WAIT_S * 2)
    assert all(isinstance(outcome, ChannelClosed) for outcome in outcomes), outcomes
