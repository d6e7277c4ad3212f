"""A request's ticket is taken and ended once by the route that admitted it, however the request ends."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import openai
import pytest
from openai import AsyncOpenAI

from llmgw.core.limits import Limits, Meter
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, KeyEntry, ReplicaEndpoint, hash_secret
from llmgw.gateway.limiting import Ticket
from llmgw.testing.eventually import eventually
from llmgw.testing.gateway_doubles import MemoryEngine

from .conftest import MESSAGES, MODEL, SECRET, WAIT

PROJECT = "project:acme/ml/chat"


@pytest.fixture
def meter(gateway: Gateway, engine: MemoryEngine) -> Meter:
    """The test key's project holds one request at a time; its engine is ready."""
    place = Place(Owner.parse(PROJECT))
    gateway.feed.keys_replaced([KeyEntry("key-1", "tests", hash_secret(SECRET), None, place)])
    gateway.feed.limits_replaced({PROJECT: Limits(concurrent=1, tokens_per_minute=1000)})
    gateway.feed.replica_ready(engine.endpoint)
    held = gateway.limiter.meter(PROJECT)
    assert held is not None
    return held


@pytest.fixture
def ended(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The tokens each ticket counted once it ended, one entry per call of Ticket.end."""
    calls: list[int] = []
    end = Ticket.end

    def counted(self: Ticket, total_tokens: int, cost: float = 0.0) -> None:
        end(self, total_tokens, cost)
        calls.append(self.counted)

    monkeypatch.setattr(Ticket, "end", counted)
    return calls


async def _whole(client: AsyncOpenAI) -> object:
    return await client.chat.completions.create(model=MODEL, messages=MESSAGES)


async def _streamed(client: AsyncOpenAI) -> object:
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    return [chunk async for chunk in stream]


@pytest.mark.parametrize(
    ("fault", "ask", "tokens"),
    [
        ({}, _whole, 10),
        ({}, _streamed, 10),
        ({"error": (500, b'{"error": {"message": "boom"}}')}, _whole, 0),
        ({"cut_after": 2}, _streamed, 2),
        ({"cut_whole": True}, _whole, 0),
        ({"abort_on_arrival": True}, _whole, 0),
    ],
    ids=["whole", "streamed", "engine-error", "stream-cut", "body-cut", "dropped-on-arrival"],
)
async def test_the_ticket_ends_once_whatever_the_answer(
    gateway: Gateway,
    engine: MemoryEngine,
    client: AsyncOpenAI,
    meter: Meter,
    ended: list[int],
    fault: dict[str, object],
    ask: Callable[[AsyncOpenAI], Awaitable[object]],
    tokens: int,
) -> None:
    for name, value in fault.items():
        setattr(engine, name, value)
    try:
        await ask(client)
    except openai.APIError:
        assert fault, "only a fault makes the request fail"
    await eventually(lambda: ended, message="the ticket ended")  # a cut stream: once its prompt is counted
    assert ended == [tokens]
    assert meter.concurrent == 0
    engine.error = engine.cut_after = None
    engine.cut_whole = engine.abort_on_arrival = False
    await _whole(client)  # the slot came back: the next request is admitted
    assert ended == [tokens, 10] and meter.concurrent == 0


async def test_the_ticket_ends_once_when_the_client_leaves_mid_stream(
    engine: MemoryEngine, client: AsyncOpenAI, meter: Meter, ended: list[int]
) -> None:
    engine.hold_after_first = asyncio.Event()
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    await asyncio.wait_for(anext(aiter(stream)), WAIT)
    assert meter.concurrent == 1
    await stream.close()
    await eventually(lambda: ended == [1], message="the ticket ended, counting the one event sent")
    assert meter.concurrent == 0


async def test_the_ticket_ends_once_when_no_replica_can_be_reached(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, meter: Meter, ended: list[int]
) -> None:
    gateway.feed.replica_gone(engine.replica_id)
    gateway.feed.replica_ready(ReplicaEndpoint("dead", MODEL, "http://nothing.invalid:1", "k"))
    with pytest.raises(openai.APIStatusError) as caught:
        await _whole(client)
    assert caught.value.status_code == 503
    assert ended == [0] and meter.concurrent == 0


async def test_the_ticket_ends_once_when_the_stream_runs_its_budget_out(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, meter: Meter, ended: list[int]
) -> None:
    gateway.feed.limits_replaced({PROJECT: Limits(concurrent=1, tokens_per_month=5)})
    engine.chunks = 50
    with pytest.raises(openai.APIError, match="tokens_per_month"):
        await _streamed(client)
    await eventually(lambda: ended, message="the ticket ended")  # once the prompt was counted
    assert len(ended) == 1 and 5 <= ended[0] < 50, "cut as the budget ran out"
    assert meter.concurrent == 0


async def test_the_ticket_ends_when_the_request_fails_before_it_is_forwarded(
    client: AsyncOpenAI, meter: Meter, ended: list[int]
) -> None:
    for _ in range(2):  # the slot of the first came back: the second is refused for its own fault again
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model=MODEL, input="hi", previous_response_id="resp_never")
        assert caught.value.code == "previous_response_not_found"
    assert ended == [0, 0] and meter.concurrent == 0
    await _whole(client)
