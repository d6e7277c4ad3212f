"""Prompt tokens from a replica's /tokenize: the engine's own tokens, cached; failures give None."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from llmgw.gateway.bodies import model_and_stream
from llmgw.gateway.replicas import ReplicaEndpoint
from llmgw.gateway.settings import GatewaySettings
from llmgw.gateway.tokenizing import Tokenizer, cache_key
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
    assert (
        tokenizer.cached("m", "hello there", {"prompt": "hello there"}) is None
    )  # one kept: the oldest went
    await upstream.close()


TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


async def test_the_same_messages_with_tools_never_reuse_the_tokens_without(base_url: str) -> None:
    upstream = Upstream(GatewaySettings())
    tokenizer = Tokenizer(upstream)
    endpoint = ReplicaEndpoint("r0", "m", base_url, "k", engine="vllm")
    messages = [{"role": "user", "content": "find it"}]
    plain = await tokenizer.tokens(endpoint, "<|user|> find it", {"messages": messages}, b"req")
    with_tools = {"messages": messages, "tools": TOOLS}
    tooled = await tokenizer.tokens(endpoint, "<|user|> find it", with_tools, b"req")
    assert plain == tokenize(render_chat(messages))
    assert tooled == tokenize(render_chat(messages, TOOLS)) != plain  # the engine rendered the tools
    assert tokenizer.asked == 2
    assert tokenizer.cached("m", "<|user|> find it", {"tools": TOOLS, "messages": messages}) == tooled
    assert await tokenizer.tokens(endpoint, "<|user|> find it", with_tools, b"req") == tooled
    assert tokenizer.asked == 2
    await upstream.close()


def test_the_cache_key_holds_what_changes_the_rendering_and_not_the_model_field() -> None:
    messages = [{"role": "user", "content": "x"}]
    plain = cache_key("m", "<|user|> x", {"messages": messages})
    assert (
        plain == cache_key("m", "<|user|> x", {"model": "m", "messages": messages}) == ("m", "<|user|> x", "")
    )
    keys = {
        cache_key("m", "<|user|> x", {"messages": messages, **extra})
        for extra in (
            {"tools": TOOLS},
            {"chat_template_kwargs": {"enable_thinking": False}},
            {"chat_template_kwargs": {"enable_thinking": True}},
            {"add_generation_prompt": False},
            {"continue_final_message": True, "add_generation_prompt": False},
            {"add_special_tokens": True},
        )
    }
    assert len(keys) == 6 and plain not in keys
    both = {"tools": TOOLS, "add_generation_prompt": True}
    assert cache_key("m", "p", {"prompt": "p", **both}) == cache_key(
        "m", "p", dict(reversed(list(both.items())))
    )


async def test_a_replica_out_of_reach_gives_none(base_url: str) -> None:
    upstream = Upstream(GatewaySettings())
    tokenizer = Tokenizer(upstream)
    wrong_key = ReplicaEndpoint("r0", "m", base_url, "not-the-key", engine="vllm")
    # vLLM guards only /v1: /tokenize answers; a replica that is gone does not.
    gone = ReplicaEndpoint("r1", "m", "http://127.0.0.1:9", "k", engine="vllm")
    assert await tokenizer.tokens(gone, "x", {"prompt": "x"}, b"req") is None
    assert await tokenizer.tokens(wrong_key, "x", {"prompt": "x"}, b"req") == tokenize("x")
    await upstream.close()


def test_the_tokenize_request_carries_what_the_chat_route_renders() -> None:
    rendering = {
        "tools": TOOLS,
        "chat_template_kwargs": {"enable_thinking": False},
        "add_generation_prompt": False,
        "continue_final_message": True,
        "add_special_tokens": True,
    }
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "The answer is"}]
    body = {"model": "m", "messages": messages, "temperature": 0.2, "max_tokens": 5, **rendering}
    facts = model_and_stream(json.dumps(body).encode())
    assert facts.prompt_request == {"messages": messages, **rendering}
    plain = model_and_stream(json.dumps({"model": "m", "messages": messages, "tool_choice": "auto"}).encode())
    assert plain.prompt_request == {"messages": messages}
    completion = {"model": "m", "prompt": "p", "add_special_tokens": False, "tools": TOOLS}
    assert model_and_stream(json.dumps(completion).encode()).prompt_request == {
        "prompt": "p",
        "add_special_tokens": False,
    }
