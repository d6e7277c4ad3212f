"""KV routing with tools: the gateway's /tokenize renders the prompt the engine computes.

Two vLLM stand-ins serve the model, naming their blocks as vLLM's
``sha256_cbor`` does; what each stores reaches the router as its KV events
would. A chat request offering tools is served once by one replica; sent
again through the gateway it goes, by its KV blocks, to that replica, whose
own prefix cache then hits. The stand-ins render tools into the prompt ahead
of the conversation, as chat templates do, so tokens asked for the messages
alone would name blocks no replica holds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from llmgw.gateway import Gateway, GatewaySettings, ReplicaEndpoint
from llmgw.gateway.routing import DECISIONS
from llmgw.gateway.upstream import Upstream
from llmgw.testing.block_hashing import block_hash, none_hash
from llmgw.testing.engine_standin import Standin, StandinSettings, build_app
from llmgw.testing.serving import bound_socket

from .conftest import MODEL

SEED = "0"
KEY = "replica-key"
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city, now",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
MESSAGES: list[Any] = [
    {"role": "system", "content": " ".join(f"rule{i}" for i in range(120))},
    {"role": "user", "content": "What is the weather in Lisbon?"},
]


def _vllm_block(parent: bytes | None, tokens: list[int]) -> bytes:
    return block_hash(parent, tokens, none_hash(SEED))


class Replica:
    """One vLLM stand-in serving MODEL, its stored blocks told to the gateway's router."""

    def __init__(self, replica_id: str, gateway: Gateway) -> None:
        settings = StandinSettings(
            engine="vllm", served_name=MODEL, api_key=KEY, startup_s=0, prefill_s=0, decode_s=0,
            hash_block=_vllm_block,
        )  # fmt: skip
        self.replica_id = replica_id
        self.standin = Standin(settings)
        kv = gateway.replicas.router.kv
        self.standin.cache.on_stored = lambda hashes, parent, tokens, salt: kv.stored(replica_id, hashes)
        self.runner = web.AppRunner(build_app(self.standin), access_log=None)
        self.url = ""

    async def start(self) -> ReplicaEndpoint:
        await self.runner.setup()
        sock = bound_socket()
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        await web.SockSite(self.runner, sock).start()
        return ReplicaEndpoint(self.replica_id, MODEL, self.url, KEY, capacity=4, engine="vllm")


@pytest.fixture
def upstream(settings: GatewaySettings) -> Upstream:
    """The stand-ins answer over sockets: the gateway calls them with its own HTTP client."""
    return Upstream(settings)


@pytest.fixture
async def replicas(gateway: Gateway) -> AsyncIterator[list[Replica]]:
    started = [Replica("r1", gateway), Replica("r2", gateway)]
    for replica in started:
        gateway.replicas.router.set_block_hashing(replica.replica_id, MODEL, SEED, 16)
    for replica in started:
        gateway.replicas.set_ready(await replica.start())
    yield started
    for replica in started:
        await replica.runner.cleanup()


def _kv_decisions() -> float:
    return DECISIONS.labels("kv")._value.get()  # type: ignore[no-any-return]


async def test_a_chat_with_tools_goes_to_the_replica_holding_its_blocks_and_hits_its_cache(
    replicas: list[Replica], client: AsyncOpenAI
) -> None:
    _, holder = replicas
    body = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "max_tokens": 1}
    async with aiohttp.ClientSession() as http:  # served once by r2 itself, before the gateway saw it
        async with http.post(
            f"{holder.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}
        ) as response:
            assert response.status == 200
    assert holder.standin.cached_tokens == 0
    before = _kv_decisions()

    await client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=1)

    assert _kv_decisions() == before + 1
    assert [r.standin.requests for r in replicas] == [0, 2]
    assert holder.standin.cached_tokens >= 16 * 8  # the engine's own prefix cache hit
