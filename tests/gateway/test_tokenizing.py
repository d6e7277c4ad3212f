"""Prompt tokens from a replica's /tokenize: the engine's own tokens, cached; failures give None."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from llmgw.gateway.replicas import ReplicaEndpoint
from llmgw.gateway.settings import GatewaySettings
from llmgw.gateway.tokenizing import Tokenizer
from llmgw.gateway.upstream import Upstream
from llmgw.testing.engine_standin import Standin, StandinSettings, build_app, render_chat, tokenize


@pytest.fixture
async def base_url() -> AsyncIterator[str]:
    standin = Standin(StandinSettings(engine="vllm", served_name="m", api_key="k", startup_s=0))
    runner = web.AppRunner(build_app(standin))
    await runner.setup()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_tokens_come_from_the_engine_and_are_cached(base_url: str) -> None:
    upstream = Upstream(GatewaySettings())
    tokenizer = Tokenizer(upstream, max_entries=1)
    endpoint = ReplicaEndpoint("r0", "m", base_url, "k", engine="vllm")
    tokens = await tokenizer.tokens(endpoint, "hello there", {"prompt": "hello there"}, b"req")
    assert tokens == tokenize("hello there") and tokenizer.asked == 1
    assert await tokenizer.tokens(endpoint, "hello there", {"prompt": "hello there"}, b"req") == tokens
    assert tokenizer.asked == 1
    messages = [{"role": "user", "content": "hi"}]
    chat = await tokenizer.tokens(endpoint, "<|user|> hi", {"messages": messages}, b"req")
    assert chat == tokenize(render_chat(messages))
    assert tokenizer.cached("m", "hello there") is None  # one entry kept: the oldest went
    await upstream.close()


async def test_a_replica_out_of_reach_gives_none(base_url: str) -> None:
    upstream = Upstream(GatewaySettings())
    tokenizer = Tokenizer(upstream)
    wrong_key = ReplicaEndpoint("r0", "m", base_url, "not-the-key", engine="vllm")
    # vLLM guards only /v1: /tokenize answers; a replica that is gone does not.
    gone = ReplicaEndpoint("r1", "m", "http://127.0.0.1:9", "k", engine="vllm")
    assert await tokenizer.tokens(gone, "x", {"prompt": "x"}, b"req") is None
    assert await tokenizer.tokens(wrong_key, "x", {"prompt": "x"}, b"req") == tokenize("x")
    await upstream.close()
