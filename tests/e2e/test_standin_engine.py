"""A cluster whose agent runs an operator-provided llama-server (the stand-in): requests through
the gateway, usage counted for streams that did not ask for it, and written to the store."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import openai
import pytest

from llmgw.store.database import Store
from llmgw.store.usage import UsageLog, UsageTotal
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.llama_server_standin import PROMPT_TOKENS, STREAM_CHUNKS, write_launcher

pytestmark = pytest.mark.e2e

MODEL = "standin-chat"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("standin")
    with Cluster(home / "cluster", home / "cache") as running:
        running.start_server()
        running.add_standin_model(MODEL)
        running.create_key("tests")
        launcher = write_launcher(home / "bin" / "llama-server")
        running.add_node("node1", engines={"llamacpp": {"binary": str(launcher)}})
        running.start_agent("node1")
        running.wait_ready(MODEL, 60)
        yield running


def client(cluster: Cluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=cluster.key, max_retries=0, timeout=30)


def usage_totals(cluster: Cluster) -> list[UsageTotal]:
    async def read() -> list[UsageTotal]:
        store = await Store.open(cluster.config.store_url)
        try:
            return await UsageLog(store).totals()
        finally:
            await store.close()

    return asyncio.run(read())


def test_the_agent_runs_the_operators_binary_and_the_gateway_counts_every_stream(cluster: Cluster) -> None:
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    answer = client(cluster).chat.completions.create(model=MODEL, messages=messages)
    assert answer.usage is not None and answer.usage.prompt_tokens == PROMPT_TOKENS
    chunks = list(client(cluster).chat.completions.create(model=MODEL, messages=messages, stream=True))
    assert len(chunks) == STREAM_CHUNKS
    assert all(chunk.usage is None for chunk in chunks)  # not asked for: withheld

    def written() -> UsageTotal | None:
        totals = [t for t in usage_totals(cluster) if t.model == MODEL]
        return totals[0] if totals and totals[0].requests == 2 else None

    total = wait_for(written, 30, "the usage of both requests is in the store")
    assert total.prompt_tokens == 2 * PROMPT_TOKENS
    assert total.completion_tokens == answer.usage.completion_tokens + STREAM_CHUNKS


def test_a_stream_asking_for_usage_gets_it(cluster: Cluster) -> None:
    chunks = list(
        client(cluster).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == STREAM_CHUNKS
    assert json.loads(chunks[-1].model_dump_json())["choices"] == []
