"""The HTTP server's connection limits, on a real loopback socket: head timeout, idle timeout, the cap."""

from __future__ import annotations

import asyncio
import json
import resource
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from llmgw.controlplane.config import HttpSettings
from llmgw.controlplane.serving.httpserving import FIRST_HEAD_GRACE_S, HttpServer, raise_descriptor_limit
from llmgw.testing.eventually import eventually

HEAD_TIMEOUT_S = 0.4
KEEP_ALIVE_S = 0.6
MARGIN_S = 1.5
REQUEST = b"GET / HTTP/1.1\r\nHost: cp1\r\n\r\n"
BODY_WINDOW_S = 0.2
BODY_MIN_RATE = 1024
BODY_TIMEOUT_S = 1.0


class App:
    """Answers 200 (``ok`` for ``/``, else the path); while :attr:`hold` is clear, requests wait for it
    (a request under way); with :attr:`reads`, it reads the whole body first (after the hold)."""

    def __init__(self) -> None:
        self.hold = asyncio.Event()
        self.hold.set()
        self.under_way = 0
        self.reads = False
        self.paths: list[str] = []
        self.client_gone = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.paths.append(scope["path"])
        self.under_way += 1
        await self.hold.wait()
        self.under_way -= 1
        while self.reads:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.client_gone += 1
                return
            if not message.get("more_body"):
                break
        body = b"ok" if scope["path"] == "/" else scope["path"].encode()
        head = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": body, "more_body": False})


@pytest.fixture
def app() -> App:
    return App()


@pytest.fixture
async def server(app: App, request: pytest.FixtureRequest) -> AsyncIterator[HttpServer]:
    settings = HttpSettings(
        port=0,
        header_timeout_s=HEAD_TIMEOUT_S,
        keep_alive_s=KEEP_ALIVE_S,
        max_connections=getattr(request, "param", 100),
        body_window_s=BODY_WINDOW_S,
        body_min_bytes_per_s=BODY_MIN_RATE,
        body_timeout_s=BODY_TIMEOUT_S,
    )
    server = HttpServer(app, settings)
    serving = asyncio.create_task(server.serve_until_stopped())
    await server.listening.wait()
    yield server
    app.hold.set()
    await server.stop()
    await serving


async def connect(server: HttpServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.port)


async def seconds_until_closed(reader: asyncio.StreamReader, within_s: float) -> float:
    """How long until the server closes the connection (read returns EOF, or it resets)."""
    started = time.monotonic()
    try:
        async with asyncio.timeout(within_s):
            while await reader.read(65536):
                pass
    except ConnectionResetError:
        pass
    return time.monotonic() - started


async def answer(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(v)
        for k, _, v in (line.partition(b": ") for line in head.split(b"\r\n"))
        if k.lower() == b"content-length"
    )
    return head + await reader.readexactly(length)


async def test_a_connection_sending_half_a_request_head_is_closed_after_the_head_timeout(
    server: HttpServer,
) -> None:
    reader, writer = await connect(server)
    writer.write(b"GET / HTTP/1.1\r\nHost: cp1\r\nX-Slow: ")
    waited = await seconds_until_closed(reader, HEAD_TIMEOUT_S + MARGIN_S)
    assert HEAD_TIMEOUT_S * 0.8 <= waited < HEAD_TIMEOUT_S + MARGIN_S
    assert server.guard.timed_out == 1
    writer.close()


async def test_a_connection_that_sends_nothing_is_closed_after_the_head_timeout(server: HttpServer) -> None:
    reader, writer = await connect(server)
    waited = await seconds_until_closed(reader, HEAD_TIMEOUT_S + MARGIN_S)
    assert waited < HEAD_TIMEOUT_S + MARGIN_S and server.guard.timed_out == 1
    writer.close()


async def test_a_head_trickled_byte_by_byte_is_cut_off_though_bytes_keep_coming(server: HttpServer) -> None:
    reader, writer = await connect(server)
    started = time.monotonic()

    async def trickle() -> None:
        for byte in b"GET / HTTP/1.1\r\nHost: cp1\r\nX-Slow: " + b"a" * 1000:
            writer.write(bytes([byte]))
            await asyncio.sleep(0.05)

    trickling = asyncio.create_task(trickle())
    await seconds_until_closed(reader, HEAD_TIMEOUT_S + MARGIN_S)
    trickling.cancel()
    assert time.monotonic() - started < HEAD_TIMEOUT_S + MARGIN_S
    writer.close()


async def test_a_kept_alive_connection_is_answered_then_closed_once_idle(server: HttpServer) -> None:
    reader, writer = await connect(server)
    writer.write(REQUEST)
    assert (await answer(reader)).startswith(b"HTTP/1.1 200")
    writer.write(REQUEST)  # a second request on the same connection, long after the first head began
    assert (await answer(reader)).startswith(b"HTTP/1.1 200")
    waited = await seconds_until_closed(reader, KEEP_ALIVE_S + MARGIN_S)
    assert KEEP_ALIVE_S * 0.8 <= waited < KEEP_ALIVE_S + MARGIN_S
    assert server.guard.timed_out == 0
    writer.close()


async def test_the_next_head_on_a_kept_alive_connection_has_the_head_timeout_too(server: HttpServer) -> None:
    reader, writer = await connect(server)
    writer.write(REQUEST)
    await answer(reader)
    writer.write(b"GET / HTTP/1.1\r\n")
    await seconds_until_closed(reader, HEAD_TIMEOUT_S + MARGIN_S)
    assert server.guard.timed_out == 1
    writer.close()


async def test_a_body_answered_unread_is_read_and_dropped_so_the_client_sees_the_answer(
    server: HttpServer,
) -> None:
    reader, writer = await connect(server)
    size = 4 << 20  # more than the sockets' buffers hold
    writer.write(b"POST / HTTP/1.1\r\nHost: cp1\r\nContent-Length: %d\r\n\r\n" % size)
    writer.write(b"x" * size)
    await writer.drain()  # every byte is taken, though the app never reads one
    assert (await answer(reader)).startswith(b"HTTP/1.1 200")
    writer.write(REQUEST)
    assert (await answer(reader)).startswith(b"HTTP/1.1 200")
    writer.close()


async def test_a_client_asking_to_close_sees_the_answer_to_a_body_read_unread_then_the_close(
    server: HttpServer,
) -> None:
    reader, writer = await connect(server)
    size = 4 << 20
    writer.write(b"POST / HTTP/1.1\r\nHost: cp1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % size)
    writer.write(b"x" * size)
    await writer.drain()  # no reset: the server takes every byte before it closes
    assert (await answer(reader)).startswith(b"HTTP/1.1 200")
    assert await seconds_until_closed(reader, MARGIN_S) < MARGIN_S
    assert server.guard.timed_out == 0
    writer.close()


async def test_a_client_asking_to_close_after_a_plain_request_is_closed_once_answered(
    server: HttpServer,
) -> None:
    reader, writer = await connect(server)
    writer.write(b"GET / HTTP/1.1\r\nHost: cp1\r\nConnection: close\r\n\r\n")
    assert (await answer(reader)).startswith(b"HTTP/1.1 200")
    assert await seconds_until_closed(reader, MARGIN_S) < MARGIN_S
    await eventually(lambda: not server.server_state.connections, message="the connection is gone")
    writer.close()


async def test_the_rest_of_a_body_answered_unread_must_come_within_the_head_timeout(
    server: HttpServer,
) -> None:
    reader, writer = await connect(server)
    writer.write(b"POST / HTTP/1.1\r\nHost: cp1\r\nContent-Length: 1000\r\n\r\n")
    assert (await answer(reader)).startswith(b"HTTP/1.1 200")
    writer.write(b"x" * 10)
    assert await seconds_until_closed(reader, HEAD_TIMEOUT_S + MARGIN_S) < HEAD_TIMEOUT_S + MARGIN_S
    assert server.guard.timed_out == 1
    writer.close()


async def test_a_slow_request_under_way_is_not_cut_by_the_head_timeout(server: HttpServer, app: App) -> None:
    app.hold.clear()
    reader, writer = await connect(server)
    writer.write(REQUEST)
    await asyncio.sleep(HEAD_TIMEOUT_S * 2)  # the time that passes is what this test is about
    app.hold.set()
    assert (await answer(reader)).startswith(b"HTTP/1.1 200")
    writer.close()


@pytest.mark.parametrize("server", [3], indirect=True)
async def test_past_the_cap_a_new_connection_takes_the_place_of_the_one_idle_longest(
    server: HttpServer,
) -> None:
    idle = []
    for count in range(1, 4):  # one at a time, so that the server holds them in this order
        idle.append(await connect(server))
        await eventually(
            lambda n=count: len(server.server_state.connections) == n, message=f"{count} accepted"
        )
    reader, writer = await connect(server)
    writer.write(REQUEST)
    assert (await answer(reader)).startswith(b"HTTP/1.1 200")
    assert await seconds_until_closed(idle[0][0], 1.0) < 1.0
    assert server.guard.evicted == 1
    assert len(server.server_state.connections) <= 3
    for _, other in [*idle, (reader, writer)]:
        other.close()


@pytest.mark.parametrize("server", [3], indirect=True)
async def test_past_the_cap_a_connection_with_part_of_a_head_goes_before_older_quiet_ones(
    server: HttpServer,
) -> None:
    """A head arriving in pieces is slowloris's mark; a client's just connected (its head not read yet)
    or kept alive stays."""
    quiet = [await connect(server), await connect(server)]
    await eventually(lambda: len(server.server_state.connections) == 2, message="2 accepted")
    slow_reader, slow_writer = await connect(server)
    slow_writer.write(b"GET / HTTP/1.1\r\nHost: cp1\r\nX-Slow: ")
    await eventually(lambda: len(server.guard.partial) == 1, message="a partial head held")
    reader, writer = await connect(server)
    writer.write(REQUEST)
    assert (await answer(reader)).startswith(b"HTTP/1.1 200")
    assert await seconds_until_closed(slow_reader, 1.0) < 1.0
    # the two older, quiet ones kept, beside the newcomer kept alive after its answer
    assert (server.guard.evicted, len(server.guard.idle), len(server.guard.partial)) == (1, 3, 0)
    for _, other in [*quiet, (slow_reader, slow_writer), (reader, writer)]:
        other.close()


@pytest.mark.parametrize("server", [2], indirect=True)
async def test_past_the_cap_with_every_connection_busy_a_new_one_is_answered_503(
    server: HttpServer, app: App
) -> None:
    app.hold.clear()
    busy = [await connect(server) for _ in range(2)]
    for _, writer in busy:
        writer.write(REQUEST)
    await eventually(lambda: app.under_way == 2, message="both requests under way")
    reader, writer = await connect(server)
    refused = await answer(reader)
    assert refused.startswith(b"HTTP/1.1 503")
    error = json.loads(refused.partition(b"\r\n\r\n")[2])["error"]
    assert "(2)" in error["message"] and "http.max_connections" in error["hint"]
    assert server.guard.refused == 1
    app.hold.set()
    for busy_reader, _ in busy:
        assert (await answer(busy_reader)).startswith(b"HTTP/1.1 200")
    for _, other in [*busy, (reader, writer)]:
        other.close()


def test_the_soft_descriptor_limit_is_raised_for_the_connections_as_far_as_the_hard_one_allows() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = soft + 16 if hard == resource.RLIM_INFINITY else min(soft + 16, hard)
    assert raise_descriptor_limit(wanted) >= wanted
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= wanted


async def test_a_request_arriving_on_a_connection_accepted_before_the_stop_is_answered_not_reset(
    server: HttpServer,
) -> None:
    """A restart stops the server while a client's connection is accepted and its request on the way:
    the request is answered (then the connection closed), and the stop waits for it."""
    reader, writer = await connect(server)
    await eventually(lambda: len(server.server_state.connections) == 1)
    (connection,) = server.server_state.connections
    stopping = asyncio.create_task(server.stop())
    await eventually(lambda: connection.stopping, message="the server has begun to stop")  # type: ignore[attr-defined]
    assert not stopping.done()  # the request comes now
    writer.write(REQUEST)
    got = await asyncio.wait_for(answer(reader), 5)
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"ok")
    assert await seconds_until_closed(reader, 2) < 2
    await asyncio.wait_for(stopping, 5)
    writer.close()


async def test_a_connection_sending_nothing_when_the_server_stops_is_closed_after_the_grace(
    server: HttpServer,
) -> None:
    reader, writer = await connect(server)
    await eventually(lambda: len(server.server_state.connections) == 1)
    started = time.monotonic()
    await asyncio.wait_for(server.stop(), 5)
    assert time.monotonic() - started < FIRST_HEAD_GRACE_S + MARGIN_S
    assert await seconds_until_closed(reader, 1) < 1
    writer.close()


def post_head(length: int) -> bytes:
    return b"POST / HTTP/1.1\r\nHost: cp1\r\nContent-Length: %d\r\n\r\n" % length


async def trickle(writer: asyncio.StreamWriter, chunk: bytes, every_s: float) -> None:
    """A client sending a body at ``len(chunk) / every_s`` bytes per second, until cancelled."""
    while not writer.is_closing():
        writer.write(chunk)
        await asyncio.sleep(every_s)  # the client's pace


def error_of(got: bytes) -> dict[str, Any]:
    error: dict[str, Any] = json.loads(got.partition(b"\r\n\r\n")[2])["error"]
    return error


async def test_a_body_trickled_under_the_rate_is_answered_408_and_its_connection_closed(
    server: HttpServer, app: App
) -> None:
    app.reads = True
    reader, writer = await connect(server)
    writer.write(post_head(100_000))
    started = time.monotonic()
    trickling = asyncio.create_task(trickle(writer, b"x" * 20, 0.05))  # 400 bytes/s
    got = await asyncio.wait_for(answer(reader), 3 * BODY_WINDOW_S + MARGIN_S)
    cut_after_s = time.monotonic() - started
    trickling.cancel()
    assert got.startswith(b"HTTP/1.1 408")
    error = error_of(got)
    assert "too slowly" in error["message"] and "http.body_min_bytes_per_s" in error["hint"]
    assert error["code"] == "request_timeout"
    # the first window is a grace: cut at the end of the second
    assert 2 * BODY_WINDOW_S * 0.8 <= cut_after_s < 3 * BODY_WINDOW_S + MARGIN_S
    assert await seconds_until_closed(reader, MARGIN_S) < MARGIN_S
    await eventually(lambda: app.client_gone == 1, message="the app heard the client gone")
    assert server.guard.slow_bodies == 1
    writer.close()


async def test_a_body_coming_above_the_rate_but_never_whole_is_cut_at_the_whole_bound(
    server: HttpServer, app: App
) -> None:
    app.reads = True
    reader, writer = await connect(server)
    writer.write(post_head(10_000_000))
    started = time.monotonic()
    trickling = asyncio.create_task(trickle(writer, b"x" * 200, 0.02))  # 10000 bytes/s
    got = await asyncio.wait_for(answer(reader), BODY_TIMEOUT_S + 2 * BODY_WINDOW_S + MARGIN_S)
    cut_after_s = time.monotonic() - started
    trickling.cancel()
    assert got.startswith(b"HTTP/1.1 408")
    error = error_of(got)
    assert "did not arrive whole" in error["message"] and "http.body_timeout_s" in error["hint"]
    assert BODY_TIMEOUT_S * 0.8 <= cut_after_s < BODY_TIMEOUT_S + 2 * BODY_WINDOW_S + MARGIN_S
    writer.close()


async def test_a_large_body_the_app_holds_back_is_not_cut_and_then_passes_whole(
    server: HttpServer, app: App
) -> None:
    app.hold.clear()
    app.reads = True
    reader, writer = await connect(server)
    size = 16 << 20  # far more than the server buffers before its app reads
    writer.write(post_head(size) + b"x" * size)
    # the time that passes is what this test is about: windows while the server holds the body back
    await asyncio.sleep(BODY_TIMEOUT_S + 3 * BODY_WINDOW_S)
    assert app.under_way == 1
    app.hold.set()
    await writer.drain()
    assert (await asyncio.wait_for(answer(reader), MARGIN_S * 2)).startswith(b"HTTP/1.1 200")
    assert server.guard.slow_bodies == 0
    writer.close()


@pytest.mark.parametrize("server", [3], indirect=True)
async def test_past_the_cap_with_every_connection_trickling_a_body_a_new_client_is_served(
    server: HttpServer, app: App
) -> None:
    app.reads = True
    slow = [await connect(server) for _ in range(3)]
    trickles = []
    for rate, (_, writer) in enumerate(slow, start=1):  # above the rate, the first slowest
        writer.write(post_head(10_000_000))
        trickles.append(asyncio.create_task(trickle(writer, b"x" * 100 * rate, 0.02)))
    await eventually(lambda: len(server.guard.receiving) == 3, message="three bodies on their way")
    started = time.monotonic()
    reader, writer = await connect(server)
    writer.write(REQUEST)
    assert (await asyncio.wait_for(answer(reader), MARGIN_S)).startswith(b"HTTP/1.1 200")
    assert time.monotonic() - started < BODY_TIMEOUT_S  # not a body cut by its timeout that made room
    assert (server.guard.evicted, server.guard.slow_bodies) == (1, 0)
    evicted = await asyncio.wait_for(answer(slow[0][0]), MARGIN_S)
    assert evicted.startswith(b"HTTP/1.1 503") and "came slowest" in error_of(evicted)["message"]
    for task in trickles:
        task.cancel()
    for _, other in [*slow, (reader, writer)]:
        other.close()


async def test_pipelined_requests_are_answered_in_order_up_to_the_one_asking_to_close(
    server: HttpServer, app: App
) -> None:
    app.hold.clear()
    reader, writer = await connect(server)
    writer.write(
        b"GET /first HTTP/1.1\r\nHost: cp1\r\n\r\n"
        b"POST /second HTTP/1.1\r\nHost: cp1\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello"
        b"GET /third HTTP/1.1\r\nHost: cp1\r\n\r\n"
    )
    await eventually(lambda: app.under_way == 1, message="the first under way, the others behind it")
    app.hold.set()
    first = await asyncio.wait_for(answer(reader), MARGIN_S)
    second = await asyncio.wait_for(answer(reader), MARGIN_S)
    assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"/first")
    assert second.startswith(b"HTTP/1.1 200") and second.endswith(b"/second")
    assert await seconds_until_closed(reader, MARGIN_S) < MARGIN_S
    assert app.paths == ["/first", "/second"]  # the one behind the close is never run
    writer.close()
