"""The gateway's HTTP client: connections reused, never a broken one, every answer shape read."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from llmgw.gateway import GatewaySettings, ReplicaEndpoint
from llmgw.gateway.upstream import Unreachable, Upstream, UpstreamDropped, UpstreamTimeout
from llmgw.testing.eventually import eventually

from .conftest import WAIT, closed_port

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class Engine:
    """A raw HTTP server: each request's head and body are recorded, the answer is given bytes."""

    def __init__(self, answers: list[bytes | None]) -> None:
        self.answers = answers
        """What to write for each request in turn; None: close the connection instead."""
        self.requests: list[bytes] = []
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                self.requests.append(head + await reader.readexactly(length))
                answer = self.answers.pop(0)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if b"connection: close" in answer.lower():
                    break
            else:
                await self._stopping.wait()  # out of answers: hold the connection open, silent
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.close()


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    client = Upstream(GatewaySettings(upstream_timeout_s=0.5, connect_timeout_s=1))
    yield client
    await client.close()


async def engine_with(*answers: bytes | None) -> Engine:
    engine = Engine(list(answers))
    await engine.start()
    return engine


def endpoint(port: int) -> ReplicaEndpoint:
    return ReplicaEndpoint("r1", "m", f"http://127.0.0.1:{port}", "engine-key")


async def ask(upstream: Upstream, engine: Engine, body: bytes = b'{"a":1}') -> tuple[int, str, bytes]:
    response = await asyncio.wait_for(upstream.post(endpoint(engine.port), "/v1/x", body, b"id-1"), WAIT)
    data = await asyncio.wait_for(response.read(), WAIT)
    response.release()
    return response.status, response.content_type, data


async def test_the_request_carries_the_replicas_key_the_request_id_and_the_body_as_given(
    upstream: Upstream,
) -> None:
    engine = await engine_with(OK)
    assert await ask(upstream, engine) == (200, "application/json", b"{}")
    head, _, body = engine.requests[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/x HTTP/1.1"
    assert b"Authorization: Bearer engine-key" in lines
    assert b"x-request-id: id-1" in lines
    assert body == b'{"a":1}'
    await engine.stop()


async def test_a_finished_answer_leaves_its_connection_for_the_next_request(upstream: Upstream) -> None:
    engine = await engine_with(OK, OK)
    await ask(upstream, engine)
    await ask(upstream, engine)
    assert engine.connections == 1
    await engine.stop()


async def test_a_connection_the_engine_closes_is_not_reused(upstream: Upstream) -> None:
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    engine = await engine_with(closing, OK)
    assert (await ask(upstream, engine))[2] == b"ok"
    assert (await ask(upstream, engine))[2] == b"{}"
    assert engine.connections == 2
    await engine.stop()


async def test_an_idle_connection_the_engine_closes_leaves_the_pool(upstream: Upstream) -> None:
    engine = await engine_with(OK)
    await ask(upstream, engine)
    (pool,) = upstream._pools.values()
    assert len(pool) == 1
    await engine.stop()  # closes the idle connection from the engine's side
    await eventually(
        lambda: not pool, timeout_s=WAIT, message="the pool drops the connection the engine closed"
    )


async def test_chunked_and_close_delimited_bodies_are_read_whole(upstream: Upstream) -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    until_close = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it"
    engine = await engine_with(chunked, until_close)
    assert (await ask(upstream, engine))[2] == b"abcde"
    assert (await ask(upstream, engine))[2] == b"all of it"
    await engine.stop()


async def test_a_body_cut_short_is_an_error_not_an_answer(upstream: Upstream) -> None:
    engine = await engine_with(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 10\r\n\r\nabc")
    with pytest.raises(UpstreamDropped):
        await ask(upstream, engine)
    await engine.stop()


async def test_a_connection_closed_before_the_answer_is_unreachable_not_connecting(
    upstream: Upstream,
) -> None:
    engine = await engine_with(None)
    with pytest.raises(Unreachable) as caught:
        await ask(upstream, engine)
    assert not caught.value.connecting
    await engine.stop()


async def test_nothing_listening_is_unreachable_while_connecting(upstream: Upstream) -> None:
    with pytest.raises(Unreachable) as caught:
        await upstream.post(endpoint(closed_port()), "/v1/x", b"{}", b"id")
    assert caught.value.connecting


async def test_a_silent_engine_times_out(upstream: Upstream) -> None:
    engine = await engine_with(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    response = await asyncio.wait_for(upstream.post(endpoint(engine.port), "/v1/x", b"{}", b"id"), WAIT)
    with pytest.raises(UpstreamTimeout):
        await asyncio.wait_for(response.read(), WAIT)
    response.close()
    await engine.stop()


async def test_a_replica_address_that_is_not_http_is_unreachable(upstream: Upstream) -> None:
    tls = ReplicaEndpoint("r1", "m", "https://127.0.0.1:1", "engine-key")
    with pytest.raises(Unreachable, match="http:// only"):
        await upstream.post(tls, "/v1/x", b"{}", b"id")


async def test_an_answer_larger_than_the_buffer_arrives_whole_after_reading_paused(
    upstream: Upstream,
) -> None:
    big = bytes(range(256)) * (3 * 4096 + 7)  # ~3 MiB: reading pauses past HIGH_WATER, resumes as read
    engine = await engine_with(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(big), big))
    response = await asyncio.wait_for(upstream.post(endpoint(engine.port), "/v1/x", b"{}", b"id"), WAIT)
    await eventually(lambda: response._paused, timeout_s=WAIT, message="nobody read: the engine is held back")
    pieces = [piece async for piece in response.iter_any()]
    response.release()
    assert b"".join(pieces) == big
    await engine.stop()
