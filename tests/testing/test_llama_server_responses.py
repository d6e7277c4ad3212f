"""The llama-server stand-in answers /v1/responses as llama-server b11434 does (recorded from the real one
with SmolLM2 in tests/engines/data/llamacpp-b11434-responses-*), and the gateway sends it what the real one
takes: a message given without its type is sent typed (the real one refuses an untyped assistant item)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from itertools import groupby
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.gateway.responses_api import input_items
from llmgw.testing import llama_server_standin
from llmgw.testing.serving import bound_socket

DATA = Path(__file__).parent.parent / "engines" / "data"


@pytest.fixture
async def standin() -> AsyncIterator[str]:
    server = llama_server_standin.StandIn("sk-x", "m", 0)
    sock = bound_socket()
    loop = asyncio.get_running_loop()
    listening = await loop.create_server(lambda: llama_server_standin._Connection(server), sock=sock)
    async with listening:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def _shape(value: Any) -> Any:
    """A JSON value's keys and types, its text and numbers left out."""
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items() if key != "timings"}
    if isinstance(value, list):
        return [_shape(item) for item in value]
    return type(value).__name__


def _events(text: str) -> list[str]:
    names = [line.removeprefix("event: ") for line in text.splitlines() if line.startswith("event: ")]
    return [name for name, _ in groupby(names)]  # a run of deltas counts once


async def test_a_whole_response_has_the_real_one_s_shape(standin: str) -> None:
    recorded = json.loads((DATA / "llamacpp-b11434-responses-whole.json").read_text())
    async with httpx.AsyncClient(headers={"authorization": "Bearer sk-x"}) as http:
        answer = await http.post(f"{standin}/v1/responses", json={"model": "m", "input": "Say hi."})
    assert answer.status_code == 200
    assert _shape(answer.json()) == _shape(recorded)


async def test_a_streamed_response_sends_the_real_one_s_events_in_its_order(standin: str) -> None:
    recorded = (DATA / "llamacpp-b11434-responses-stream.txt").read_text()
    async with httpx.AsyncClient(headers={"authorization": "Bearer sk-x"}) as http:
        answer = await http.post(
            f"{standin}/v1/responses", json={"model": "m", "input": "hi", "stream": True}
        )
    assert answer.status_code == 200
    assert _events(answer.text) == _events(recorded)
    completed = json.loads(answer.text.rstrip().rsplit("data: ", 1)[1])
    real = json.loads(recorded.rstrip().rsplit("data: ", 1)[1])
    assert _shape(completed["response"]) | {"completed_at": "int"} == _shape(real["response"]) | {
        "completed_at": "int"
    }


async def test_an_untyped_assistant_item_is_refused_as_the_real_one_refuses_it(standin: str) -> None:
    recorded = json.loads((DATA / "llamacpp-b11434-responses-untyped-item.json").read_text())
    conversation = [{"role": "user", "content": "I am Ada."}, {"role": "assistant", "content": "Hi Ada"}]
    async with httpx.AsyncClient(headers={"authorization": "Bearer sk-x"}) as http:
        refused = await http.post(f"{standin}/v1/responses", json={"model": "m", "input": conversation})
        sent = await http.post(
            f"{standin}/v1/responses", json={"model": "m", "input": input_items(conversation)}
        )
    assert (refused.status_code, refused.json()) == (400, recorded)
    assert sent.status_code == 200, "the gateway sends each message typed"
