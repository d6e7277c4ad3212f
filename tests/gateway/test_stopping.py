"""Work nobody waits for is stopped: a client leaving at any stage ends its engine request, and a
model's ``request_timeout_s`` ends one that ran too long (504 ``request_timeout``, or an error
event in a stream already started)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from llmgw.core.catalog import ModelDefinition
from llmgw.gateway import Gateway, GatewaySettings, ModelEntry, ReplicaEndpoint
from llmgw.gateway.catalog_view import catalog_entries
from llmgw.gateway.tokenizing import Tokenizer
from llmgw.gateway.upstream import RequestTimedOut, Upstream
from llmgw.testing.eventually import eventually
from llmgw.testing.gateway_doubles import MemoryUpstream

from .conftest import AUTH, LAZY, MESSAGES, MODEL, WAIT, MemoryEngine, RecordingOutbound

LIMIT_S = 0.2
"""The engine time limit of the models under test: short, far under the silence limit."""
SHA = "a" * 64


@pytest.fixture
def settings() -> GatewaySettings:
    return GatewaySettings(request_wait_s=WAIT * 2, upstream_timeout_s=WAIT * 2, retry_after_s=5)


@pytest.fixture
def limited(gateway: Gateway) -> Gateway:
    """The gateway with MODEL limited to LIMIT_S on its engine."""
    gateway.catalog.put(ModelEntry(MODEL, request_timeout_s=LIMIT_S))
    return gateway


# -- a client leaving -------------------------------------------------------------------------------


async def test_a_client_leaving_while_its_request_waits_for_a_replica_stops_waiting(
    gateway: Gateway, engine: MemoryEngine, http: httpx.AsyncClient, hooks: RecordingOutbound
) -> None:
    body = json.dumps({"model": LAZY, "messages": MESSAGES})
    request = asyncio.create_task(http.post("/v1/chat/completions", content=body, headers=AUTH))
    await eventually(lambda: gateway.replicas.model_load(LAZY).waiting == 1, message="the request waits")
    request.cancel()
    await eventually(lambda: gateway.replicas.model_load(LAZY).waiting == 0, message="the wait ended")
    gateway.replicas.set_ready(ReplicaEndpoint("r-lazy", LAZY, engine.base_url, engine.key))
    with pytest.raises(asyncio.CancelledError):
        await request
    assert engine.requests == [], "a replica ready after the client left is sent nothing"
    assert hooks.wanted == [LAZY]


async def test_a_client_leaving_while_its_prompt_is_tokenized_closes_that_connection(
    upstream: MemoryUpstream,
) -> None:
    engine = upstream.engine(MemoryEngine(hold=asyncio.Event()))
    tokenizer = Tokenizer(upstream)
    asking = asyncio.create_task(tokenizer.tokens(engine.endpoint, "hi", {"prompt": "hi"}, b"req"))
    await asyncio.wait_for(engine.arrived.wait(), WAIT)
    (answer,) = upstream.answers
    answer.start(200)  # the head came; the tokens not yet
    await eventually(lambda: answer.reading, message="the tokenizer reads the body")
    asking.cancel()
    await asyncio.wait_for(engine.dropped.wait(), WAIT)
    assert answer.closed


def upstream_closed(gateway: Gateway, engine: MemoryEngine) -> bool:
    upstream = gateway.upstream
    assert isinstance(upstream, MemoryUpstream)
    # the prompt count of a stream cut short asks the engine's tokenizer after it: that one is pooled
    asked = [answer for answer in upstream.answers if answer.path not in ("/tokenize", "/apply-template")]
    return all(answer.closed for answer in asked) and gateway.replicas.in_flight("r1") == 0


# -- the engine time limit --------------------------------------------------------------------------


async def test_a_request_past_its_models_time_limit_answers_504_and_stops_the_engine(
    limited: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    engine.hold = asyncio.Event()  # the engine works and works: no head, no byte
    limited.replicas.set_ready(engine.endpoint)
    with pytest.raises(openai.APIStatusError) as caught:
        await asyncio.wait_for(client.chat.completions.create(model=MODEL, messages=MESSAGES), WAIT)
    assert caught.value.status_code == 504
    assert caught.value.code == "request_timeout"
    assert f"({LIMIT_S:g} s)" in caught.value.message and "request_timeout_s" in caught.value.message
    await asyncio.wait_for(engine.dropped.wait(), WAIT)
    (record,) = await eventually(lambda: hooks.records)
    assert (record.status, record.replica_id) == (504, "r1")
    assert upstream_closed(limited, engine)


async def test_a_whole_answer_still_coming_at_the_limit_answers_504(
    limited: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    engine.hold = asyncio.Event()
    limited.replicas.set_ready(engine.endpoint)
    asking = asyncio.create_task(client.chat.completions.create(model=MODEL, messages=MESSAGES))
    await asyncio.wait_for(engine.arrived.wait(), WAIT)
    upstream = limited.upstream
    assert isinstance(upstream, MemoryUpstream)
    upstream.answers[0].start(200)  # the head came; the body never ends
    with pytest.raises(openai.APIStatusError) as caught:
        await asyncio.wait_for(asking, WAIT)
    assert (caught.value.status_code, caught.value.code) == (504, "request_timeout")
    assert upstream.answers[0].closed


async def test_a_stream_past_its_models_time_limit_ends_with_an_error_event(
    limited: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    engine.hold_after_first = asyncio.Event()
    limited.replicas.set_ready(engine.endpoint)
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    received = []
    with pytest.raises(openai.APIError) as caught:
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content)
    assert received == ["r1-0 "]
    assert "time limit" in caught.value.message and "request_timeout_s" in caught.value.message
    await asyncio.wait_for(engine.dropped.wait(), WAIT)
    (record,) = await eventually(lambda: hooks.records)
    assert (record.status, record.replica_id) == (504, "r1")
    assert upstream_closed(limited, engine)


async def test_a_responses_stream_past_the_limit_ends_with_an_error_event_of_its_own_shape(
    limited: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    engine.hold_after_first = asyncio.Event()
    limited.replicas.set_ready(engine.endpoint_for(MODEL, engine="sglang"))  # chat translated
    stream = await client.responses.create(model=MODEL, input="hi", stream=True)
    events = [event async for event in stream]
    assert events[-1].type == "error"
    assert events[-1].code == "request_timeout"  # type: ignore[union-attr]


async def test_a_request_answered_within_the_limit_is_answered_and_its_timer_let_go(
    limited: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    limited.replicas.set_ready(engine.endpoint)
    answer = await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert answer.choices[0].message.content == "r1"
    upstream = limited.upstream
    assert isinstance(upstream, MemoryUpstream)
    timer = upstream.answers[0].deadline
    assert timer is not None and timer.cancelled()


async def test_a_model_without_a_limit_sends_its_requests_without_a_deadline(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI
) -> None:
    gateway.replicas.set_ready(engine.endpoint)
    await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    upstream = gateway.upstream
    assert isinstance(upstream, MemoryUpstream)
    assert upstream.answers[0].deadline is None


def definition(*limits: float | None, adapters: bool = False) -> ModelDefinition:
    data: dict[str, object] = {
        "name": "m",
        "source": {"sha256": SHA},
        "profiles": [{"request_timeout_s": limit} if limit is not None else {} for limit in limits],
    }
    if adapters:
        data["adapters"] = [{"name": "m-lora", "sha256": "b" * 64, "filename": "lora.gguf"}]
    return ModelDefinition.model_validate(data)


def test_the_gateway_takes_the_longest_limit_of_a_models_profiles_and_its_adapters_share_it() -> None:
    entries = {entry.name: entry for entry in catalog_entries([definition(30, 120, adapters=True)])}
    assert entries["m"].request_timeout_s == 120
    assert entries["m-lora"].request_timeout_s == 120


def test_a_profile_without_a_limit_leaves_the_model_without_one() -> None:
    (entry,) = catalog_entries([definition(30, None)])
    assert entry.request_timeout_s is None


# -- the HTTP client's deadline, over a socket ------------------------------------------------------


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class SlowEngine:
    """Answers a chunked head and one chunk, then nothing more; notes when the gateway closes."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        writer.write(b"6\r\ndata: \r\n")
        await writer.drain()
        try:
            while await reader.read(1024):
                pass
        except ConnectionError:
            pass
        self.closed.set()
        writer.close()

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()


@pytest.fixture
async def slow() -> AsyncIterator[SlowEngine]:
    engine = SlowEngine()
    await engine.start()
    yield engine
    engine.stop()


async def test_the_http_clients_deadline_closes_the_engines_connection_mid_answer(slow: SlowEngine) -> None:
    client = Upstream(GatewaySettings(upstream_timeout_s=WAIT * 2))
    endpoint = ReplicaEndpoint("r1", MODEL, f"http://127.0.0.1:{slow.port}", "k")
    try:
        loop = asyncio.get_running_loop()
        response = await client.post(
            endpoint, "/v1/chat/completions", b"{}", b"req", deadline=loop.time() + LIMIT_S
        )
        pieces = []
        with pytest.raises(RequestTimedOut):
            async for piece in response.iter_any():
                pieces.append(piece)
        assert pieces == [b"data: "], "what came before the deadline is read first"
        await asyncio.wait_for(slow.closed.wait(), WAIT)  # closed by the deadline, before the gateway did
        response.close()
    finally:
        await client.close()
