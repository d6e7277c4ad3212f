"""``ctx_size`` is the context of one request on llama.cpp too, and a request past it names the setting.

SmolLM2 on llama-server with ``ctx_size: 1024, parallel: 2``: llama-server
gets ``--ctx-size 2048`` and gives each of its two slots 1024 tokens. A
prompt of about 700 tokens fits (it did not when 1024 was the two slots'
total: 512 each; llama.cpp gives a slot at least 256, so smaller figures would
not tell); one of about 1200 is refused, and the client reads which setting
to raise.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmgw.cli.up import DEFAULT_MODEL
from llmgw.testing.cluster import Cluster

pytestmark = pytest.mark.e2e


def words(count: int) -> str:
    """About ``count`` tokens of text: " apple" is one token in SmolLM2's tokenizer."""
    return " ".join(["apple"] * count)


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, engine_cache: Path, model_file: Path
) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("context"), engine_cache) as running:
        running.start_server()
        running.add_model(DEFAULT_MODEL, model_file, {"ctx_size": 1024, "parallel": 2})
        running.create_key()
        running.start_agent("node1")
        running.wait_ready(DEFAULT_MODEL, 180)
        yield running


def _chat(cluster: Cluster, text: str) -> httpx.Response:
    body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {cluster.key}"}
    return httpx.post(f"{cluster.url}/v1/chat/completions", json=body, headers=headers, timeout=60)


def test_a_prompt_within_one_requests_context_is_answered(cluster: Cluster) -> None:
    answer = _chat(cluster, words(700))
    assert answer.status_code == 200, answer.text
    assert 512 < answer.json()["usage"]["prompt_tokens"] < 1024 - 4


def test_a_prompt_past_the_context_is_a_400_naming_ctx_size(cluster: Cluster) -> None:
    answer = _chat(cluster, words(1200))
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "the context of one request, the model's ctx_size, is 1024 tokens" in error["message"]
    assert "ctx_size" in error["hint"]
