"""Usage reconciles: over a mixed run through the gateway on a stand-in vLLM (whole answers, streams,
streams the client closes early, requests refused by a rate limit and by bad bodies), /api/usage's
lines agree with the gateway's Prometheus counters and with what the clients received — the
gateway's usage written by the control plane's usage writer into a real SQLite store."""

from __future__ import annotations

import json
import socket
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web
from openai import AsyncOpenAI, RateLimitError
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client import REGISTRY
from starlette.types import Message, Receive, Scope, Send

from llmgw.controlplane.accounting.usage_writing import UsageWriter
from llmgw.core.limits import Limits
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, GatewaySettings, KeyEntry, ModelEntry, ReplicaEndpoint, hash_secret
from llmgw.gateway.usage import UsageRecord
from llmgw.store.usage import UsageLog
from llmgw.testing.asgi_client import StreamingAsgiTransport
from llmgw.testing.engine_standin import Standin, StandinSettings, build_app, render_chat, tokenize

from .test_tenancy_api import Cluster
from .test_tenancy_api import cluster as cluster  # the fixture, shared

MODEL = "reconciled-chat"
CHAT = "project:acme/ml/chat"
SHOP = "project:acme/web/shop"
SECRETS = {"k-chat": "sk-llmgw-chat-0123456789", "k-shop": "sk-llmgw-shop-0123456789"}
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "count the tokens of this"}]
PROMPT = len(tokenize(render_chat(list(MESSAGES))))
"""The prompt's tokens, as the stand-in counts them in its usage and its /tokenize."""
MAX_TOKENS = 12
LONG = 200
"""The tokens asked of a stream the client closes early (it never gets near its end)."""


class WriterOutbound:
    """The control plane's side: every usage record goes to the usage writer."""

    def __init__(self, writer: UsageWriter) -> None:
        self.writer = writer

    def replica_wanted(self, model: str) -> None:
        return None

    def model_used(self, model: str) -> None:
        return None

    def usage(self, record: UsageRecord) -> None:
        self.writer.add(record)

    def replica_failed(self, replica_id: str, reason: str) -> None:
        return None


class Delivered:
    """The gateway app, keeping the bytes each request's client connection was handed."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        parts: list[bytes] = []
        self.bodies.append(b"")
        index = len(self.bodies) - 1

        async def keeping(message: Message) -> None:
            if message["type"] == "http.response.body":
                parts.append(message.get("body", b""))
                self.bodies[index] = b"".join(parts)
            await send(message)

        await self.app(scope, receive, keeping)


def content_chunks(stream: bytes) -> int:
    """Chunks with text in an SSE stream, counted as a client counts them (each parsed)."""
    count = 0
    for line in stream.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:]).get("choices", []):
                count += bool((choice.get("delta") or {}).get("content"))
    return count


@pytest.fixture
async def engine_url() -> AsyncIterator[str]:
    standin = Standin(
        StandinSettings(engine="vllm", served_name=MODEL, api_key="k", startup_s=0, decode_s=0.001)
    )
    runner = web.AppRunner(build_app(standin))
    await runner.setup()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


def prometheus() -> dict[tuple[str, str, str], float]:
    """The gateway's counters of this test's model and projects, by (name, project, code or '')."""
    out: dict[tuple[str, str, str], float] = {}
    for family in REGISTRY.collect():
        for sample in family.samples:
            labels = sample.labels
            if labels.get("model") not in (MODEL, "") or labels.get("project") not in (CHAT, SHOP):
                continue
            if sample.name in (
                "llmgw_gateway_requests_total",
                "llmgw_gateway_prompt_tokens_total",
                "llmgw_gateway_completion_tokens_total",
            ):
                key = (sample.name, labels["project"], labels.get("code", ""))
                out[key] = out.get(key, 0.0) + sample.value
    return out


async def test_usage_agrees_with_prometheus_and_with_what_clients_received(
    cluster: Cluster, engine_url: str
) -> None:
    writer = UsageWriter(UsageLog(cluster.store), cluster.clock.utcnow, interval_s=3600)
    gateway = Gateway(GatewaySettings(request_wait_s=0.3), outbound=WriterOutbound(writer))
    gateway.feed.keys_replaced(
        [
            KeyEntry(key, key, hash_secret(secret), None, Place(Owner.parse(place)))
            for (key, secret), place in zip(SECRETS.items(), (CHAT, SHOP), strict=True)
        ]
    )
    gateway.feed.limits_replaced({"key:k-shop": Limits(requests_per_minute=5)})
    gateway.catalog.replace([ModelEntry(MODEL)])
    gateway.replicas.set_ready(ReplicaEndpoint("r1", MODEL, engine_url, "k", capacity=8, engine="vllm"))
    app = Delivered(gateway.asgi_app())
    before = prometheus()
    received: Counter[str] = Counter()
    """Completion tokens the clients received, per key."""

    def http() -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=StreamingAsgiTransport(app), base_url="http://gw/v1", timeout=30)

    def sdk(key: str) -> AsyncOpenAI:
        return AsyncOpenAI(base_url="http://gw/v1", api_key=SECRETS[key], max_retries=0, http_client=http())

    async with sdk("k-chat") as chat, sdk("k-shop") as shop, http() as raw:
        for _ in range(10):  # whole answers
            answer = await chat.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=MAX_TOKENS)
            assert answer.usage is not None
            received["k-chat"] += answer.usage.completion_tokens
        for _ in range(10):  # streams read to their end
            stream = await chat.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=MAX_TOKENS, stream=True
            )
            received["k-chat"] += sum([bool(c.choices and c.choices[0].delta.content) async for c in stream])
        for _ in range(6):  # streams the client closes after three chunks
            stream = await chat.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=LONG, stream=True
            )
            read = 0
            async for chunk in stream:
                read += bool(chunk.choices and chunk.choices[0].delta.content)
                if read == 3:
                    break
            await stream.close()
            delivered = content_chunks(app.bodies[-1])  # handed to its connection before it closed
            assert 3 <= delivered < LONG
            received["k-chat"] += delivered
        bearer = {"Authorization": f"Bearer {SECRETS['k-chat']}"}
        for content in (b"{not json", b'{"model": 1}', b"[]", b'{"model": "nowhere", "messages": []}'):
            refused = await raw.post("/chat/completions", content=content, headers=bearer)
            assert refused.status_code == (404 if b"nowhere" in content else 400)
        for _ in range(8):  # five within the rate, three refused 429
            try:
                answer = await shop.chat.completions.create(
                    model=MODEL, messages=MESSAGES, max_tokens=MAX_TOKENS
                )
            except RateLimitError:
                continue
            assert answer.usage is not None
            received["k-shop"] += answer.usage.completion_tokens

    assert await writer.flush()
    body = (await cluster.admin.get("/api/usage", params={"group_by": "key"})).json()
    lines = {line["key"]: line for line in body["lines"]}
    chat_line, shop_line = lines["k-chat"], lines["k-shop"]

    # what the clients received, and the prompts of every request a replica took
    assert chat_line["completion_tokens"] == received["k-chat"]
    assert shop_line["completion_tokens"] == received["k-shop"] == 5 * MAX_TOKENS
    assert chat_line["prompt_tokens"] == 26 * PROMPT  # the six closed early: from the tokenizer
    assert shop_line["prompt_tokens"] == 5 * PROMPT
    # every request, refused ones by status
    assert (chat_line["requests"], chat_line["errors"]) == (30, 10)  # 6 left (499), 3 bad, 1 unknown
    assert chat_line["refused"] == {"400": 3, "404": 1}
    assert (shop_line["requests"], shop_line["errors"], shop_line["refused"]) == (8, 3, {"429": 3})

    # the gateway's Prometheus counters say the same
    after = prometheus()
    delta = {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}
    for place, line in ((CHAT, chat_line), (SHOP, shop_line)):
        codes = {
            code: n
            for (name, p, code), n in delta.items()
            if p == place and name.startswith("llmgw_gateway_requests")
        }
        assert sum(codes.values()) == line["requests"]
        assert sum(n for code, n in codes.items() if int(code) >= 400) == line["errors"]
        for code, count in line["refused"].items():
            assert codes[code] == count
        assert delta[("llmgw_gateway_prompt_tokens_total", place, "")] == line["prompt_tokens"]
        assert delta[("llmgw_gateway_completion_tokens_total", place, "")] == line["completion_tokens"]
    await gateway.close()
