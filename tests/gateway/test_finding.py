"""One wait for a replica, shared by chat, adapters and jobs (gateway/finding.py)."""

from __future__ import annotations

import asyncio

import openai
import pytest
from openai import AsyncOpenAI

from llmgw.gateway import Gateway, GatewaySettings, KeyRing, ReplicaEndpoint, ReplicaTable
from llmgw.gateway.adapters import Adapters
from llmgw.gateway.catalog_view import GatewayCatalog
from llmgw.gateway.feeding import GatewayFeed
from llmgw.gateway.finding import ReplicaFinder
from llmgw.gateway.outbound import Telling
from llmgw.testing.eventually import eventually
from llmgw.testing.gateway_doubles import MemoryEngine, MemoryUpstream, RecordingOutbound

from .conftest import MESSAGES, MODEL, WAIT


@pytest.mark.parametrize("settings", [{"request_wait_s": WAIT}], indirect=True)
async def test_a_chat_request_waits_while_its_replicas_load_cannot_be_read_and_asks_for_no_replica(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    gateway.feed.replica_ready(engine.endpoint)
    gateway.replicas.set_engine_load(engine.replica_id, None)  # its metrics could not be read
    asking = asyncio.create_task(client.chat.completions.create(model=MODEL, messages=MESSAGES))
    await eventually(lambda: gateway.feed.model_load(MODEL).waiting == 1, message="the request waits")
    assert not asking.done() and engine.requests == []
    gateway.replicas.set_engine_load(engine.replica_id, 0)  # read again: routable
    answer = await asyncio.wait_for(asking, WAIT)
    assert answer.choices[0].message.content == "r1"
    assert hooks.wanted == [], "the replica is there: nothing is started"


async def test_a_chat_request_whose_replicas_load_stays_unread_answers_503_after_its_wait(
    gateway: Gateway, engine: MemoryEngine, client: AsyncOpenAI, hooks: RecordingOutbound
) -> None:
    gateway.feed.replica_ready(engine.endpoint)
    gateway.replicas.set_engine_load(engine.replica_id, None)
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(openai.InternalServerError) as caught:
        await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert loop.time() - began >= gateway.settings.request_wait_s
    assert caught.value.status_code == 503 and caught.value.code == "model_not_ready"
    assert "could not be read" in caught.value.message
    assert caught.value.response.headers["retry-after"] == "5"
    assert hooks.wanted == [] and engine.requests == []


def _finder(wait_s: float) -> tuple[ReplicaFinder, ReplicaTable, RecordingOutbound]:
    table, outbound = ReplicaTable(), RecordingOutbound()
    feed = GatewayFeed(KeyRing(), GatewayCatalog(), table, Adapters(table, MemoryUpstream()))
    finder = ReplicaFinder(
        GatewaySettings(request_wait_s=wait_s), table, GatewayCatalog(), Telling(outbound, feed, table)
    )
    return finder, table, outbound


async def test_the_finder_asks_for_a_replica_once_however_often_it_looks_again() -> None:
    finder, table, outbound = _finder(WAIT)
    looks = 0
    other = ReplicaEndpoint("o1", "other", "http://o", "k")

    async def pick() -> ReplicaEndpoint | None:
        nonlocal looks
        looks += 1
        return table.pick("m")

    finding = asyncio.create_task(finder.find("m", pick))
    await eventually(lambda: table.model_load("m").waiting == 1)
    table.set_ready(other)  # another model's replica: no wake for "m"
    table.set_ready(ReplicaEndpoint("r1", "m", "http://r", "k"))
    table.set_engine_load("r1", None)  # ready but unreadable: looked at again, nothing asked
    endpoint = ReplicaEndpoint("r1", "m", "http://r", "k")
    await eventually(lambda: looks >= 2)
    assert not finding.done()
    table.set_engine_load("r1", 0)
    assert await asyncio.wait_for(finding, WAIT) == endpoint
    assert outbound.wanted == ["m"]


async def test_the_finder_gives_up_after_request_wait_s() -> None:
    finder, table, outbound = _finder(0.05)

    async def pick() -> ReplicaEndpoint | None:
        return table.pick("m")

    assert await finder.find("m", pick) is None
    assert outbound.wanted == ["m"] and table.model_load("m").waiting == 0
    assert "No replica of model 'm' is ready" in finder.not_ready("m").message
