"""The OpenAI surface through a real control plane and agent on real llama-server with SmolLM2.

llama-server serves the Responses API itself (llmgw keeps conversations and
sends each request whole); a second model on the same weights serves
embeddings (``serves: embeddings``, mean pooling). Reranking needs a
reranker's classification head, which SmolLM2 has not: it is checked on the
stand-ins (test_openai_standins.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from llmgw.testing import openai_conformance as conformance
from llmgw.testing.cluster import Cluster

pytestmark = pytest.mark.e2e

CHAT = "smol"
EMBED = "smol-embed"


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory, engine_cache: Path, model_file: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("smol"), engine_cache) as running:
        running.start_server()
        running.add_model(CHAT, model_file, {"ctx_size": 2048, "parallel": 2})
        running.add_model(
            EMBED, model_file, {"ctx_size": 512, "parallel": 1, "serves": "embeddings", "pooling": "mean"}
        )
        running.create_key()
        running.start_agent("node1")
        running.wait_ready(CHAT, 180)
        running.wait_ready(EMBED, 180)
        yield running


def client(cluster: Cluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=cluster.key, max_retries=0, timeout=60)


@pytest.mark.parametrize("call", sorted(conformance.CHECKS))
def test_every_chat_call_of_the_sdk_passes(smol: Cluster, call: str) -> None:
    conformance.CHECKS[call](client(smol), CHAT)


def test_embeddings(smol: Cluster) -> None:
    conformance.embeddings(client(smol), EMBED)


def test_embeddings_of_a_text_are_the_same_each_time_and_differ_between_texts(smol: Cluster) -> None:
    sdk = client(smol)
    one, again, other = (
        sdk.embeddings.create(model=EMBED, input=text).data[0].embedding
        for text in ("red", "red", "a ship at sea")
    )
    assert one == again and one != other


def test_the_chat_model_asked_for_embeddings_answers_400_not_the_engines_501(smol: Cluster) -> None:
    conformance.refused_for_the_wrong_task(client(smol), CHAT)


def test_the_embedding_model_asked_to_chat_answers_400(smol: Cluster) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(smol).chat.completions.create(model=EMBED, messages=[{"role": "user", "content": "hi"}])
    assert "serves embeddings" in caught.value.message
