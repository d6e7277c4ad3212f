"""Fixtures the protocol's tests share: a cluster CA with certificates, and connected channel pairs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from llmgw.core.relays import RelayPeer
from llmgw.protocol.channels import ControlChannel
from llmgw.protocol.grpc_client import GrpcConnector
from llmgw.protocol.grpc_transport import AgentServer
from llmgw.testing.channel_conformance import WAIT_S, Pair, PairFactory, memory_pairs, unix_pairs

from .cluster_pki import Pki, make_pki


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path)


def grpc_pairs(pki: Pki) -> PairFactory:
    """Pairs over real gRPC with mutual TLS on 127.0.0.1: an agent stream and the server's side of it."""

    @asynccontextmanager
    async def opened() -> AsyncIterator[Pair]:
        arrived: asyncio.Queue[ControlChannel] = asyncio.Queue()
        released = asyncio.Event()

        async def session(channel: ControlChannel) -> None:
            await arrived.put(channel)
            await released.wait()  # the stream lasts until the pair is done with, or a side closes it

        async def no_blobs(peer: RelayPeer, sha256: str, offset: int) -> AsyncIterator[bytes]:
            return
            yield b""  # pragma: no cover - makes this a generator

        server = AgentServer(session, no_blobs, pki.server, "127.0.0.1", 0)
        port = await server.start()
        target = f"127.0.0.1:{port}"
        agent = await GrpcConnector(target, pki.node).connect(timeout_s=WAIT_S)
        try:
            control = await asyncio.wait_for(arrived.get(), WAIT_S)
            yield Pair(agent, control, agent_name="node-1", control_name=target)
        finally:
            released.set()
            await agent.close()
            await server.stop()

    return opened


@pytest.fixture(params=["memory", "grpc", "unix"])
def channel_pairs(request: pytest.FixtureRequest, pki: Pki) -> PairFactory:
    """Each implementation of the channel in turn."""
    if request.param == "memory":
        return memory_pairs
    if request.param == "unix":
        return unix_pairs
    return grpc_pairs(pki)
