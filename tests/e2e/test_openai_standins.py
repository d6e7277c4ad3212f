"""The OpenAI surface through a real control plane and agent, on the vLLM, SGLang and TensorRT-LLM stand-ins.

Each check of :mod:`llmgw.testing.openai_conformance` drives one call of the
``openai`` SDK; together with test_openai_llamacpp.py they say which calls
pass on which engine (docs/openai.md). vLLM serves the Responses API itself;
SGLang and TensorRT-LLM are sent a translated chat completion.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from llmgw.testing import openai_conformance as conformance
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.nvidia_smi_standin import H100_80G, install_fake_nvidia_smi
from llmgw.testing.standin_programs import write_standins

pytestmark = pytest.mark.e2e

MODELS = {
    "v-chat": ("vllm", "chat"),
    "v-embed": ("vllm", "embeddings"),
    "v-rank": ("vllm", "rerank"),
    "s-chat": ("sglang", "chat"),
    "s-embed": ("sglang", "embeddings"),
    "s-rank": ("sglang", "rerank"),
    "t-chat": ("trtllm", "chat"),
}
CHAT_MODELS = sorted(name for name, (_, serves) in MODELS.items() if serves == "chat")


@pytest.fixture(scope="module")
def surface(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("surface")
    programs = write_standins(home / "standins")
    with Cluster(home / "cluster", home / "cache") as running:
        running.start_server()
        blob = running.upload(filename="config.json", data=b'{"architectures": ["LlamaForCausalLM"]}')
        for name, (engine, serves) in MODELS.items():
            running.admin.request(
                "POST",
                "/api/models",
                {
                    "name": name,
                    "source": {"sha256": blob["sha256"], "filename": "config.json", "format": "safetensors"},
                    "profile": {"engine": engine, "ctx_size": 4096, "parallel": 2, "serves": serves},
                },
            )
        running.create_key("tests")
        running.add_node(
            "node1",
            nvidia_smi=str(
                install_fake_nvidia_smi(home / "smi", [H100_80G, H100_80G], driver_version="580.82.07")
            ),
            engines=programs.engine_settings(),
        )
        running.start_agent("node1")
        for name in MODELS:
            running.wait_ready(name, 120)
        yield running


def client(cluster: Cluster, key: str = "") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=key or cluster.key, max_retries=0, timeout=30)


@pytest.mark.parametrize("call", sorted(conformance.CHECKS))
@pytest.mark.parametrize("model", CHAT_MODELS)
def test_every_chat_call_of_the_sdk_passes(surface: Cluster, model: str, call: str) -> None:
    conformance.CHECKS[call](client(surface), model)


@pytest.mark.parametrize("model", ["v-embed", "s-embed"])
def test_embeddings(surface: Cluster, model: str) -> None:
    conformance.embeddings(client(surface), model)


@pytest.mark.parametrize("model", ["v-rank", "s-rank"])
def test_rerank(surface: Cluster, model: str) -> None:
    conformance.rerank(client(surface), model)


def test_rerank_at_the_root_path_as_rerank_clients_call_it(surface: Cluster) -> None:
    request = urllib.request.Request(
        f"{surface.url}/rerank",
        data=json.dumps(
            {"model": "v-rank", "query": "red fruit", "documents": ["a blue car", "a red apple"]}
        ).encode(),
        headers={"Authorization": f"Bearer {surface.key}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        results = json.load(answer)["results"]
    assert results[0]["index"] == 1


@pytest.mark.parametrize("model", CHAT_MODELS)
def test_a_chat_model_asked_for_embeddings_answers_400(surface: Cluster, model: str) -> None:
    conformance.refused_for_the_wrong_task(client(surface), model)


def test_an_embedding_model_asked_for_a_response_answers_400(surface: Cluster) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(surface).responses.create(model="v-embed", input="hi")
    assert "serves embeddings" in caught.value.message


def test_a_wrong_key_is_401_and_an_unknown_model_404(surface: Cluster) -> None:
    with pytest.raises(openai.AuthenticationError):
        client(surface, "sk-wrong").responses.create(model="v-chat", input="hi")
    with pytest.raises(openai.NotFoundError) as caught:
        client(surface).responses.create(model="no-such-model", input="hi")
    assert caught.value.code == "model_not_found"


def test_a_key_over_its_limit_is_429_with_retry_after(surface: Cluster) -> None:
    created = surface.admin.request("POST", "/api/keys", {"name": "limited"})
    surface.admin.request("PUT", f"/api/limits/key:{created['id']}", {"requests_per_minute": 1})
    limited = client(surface, created["key"])
    wait_for(lambda: _answers(limited), 10, "the limited key is known to the gateway")
    with pytest.raises(openai.RateLimitError) as caught:
        for _ in range(3):  # each gateway worker holds a share of the limit, and admits one at least
            limited.responses.create(model="s-chat", input="hi", max_output_tokens=2)
    assert caught.value.response.headers.get("retry-after")


def _answers(sdk: openai.OpenAI) -> bool:
    try:
        sdk.responses.create(model="s-chat", input="hi", max_output_tokens=2)
    except openai.AuthenticationError:
        return False
    return True


def _running(cluster: Cluster, model: str) -> float:
    """vLLM's running requests, read from the stand-in's own metrics."""
    port = cluster.wait_ready(model)["port"]
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request("GET", "/metrics", headers={"Authorization": f"Bearer {cluster.engine_key(port)}"})
    text = connection.getresponse().read().decode()
    connection.close()
    line = next(line for line in text.splitlines() if line.startswith("vllm:num_requests_running"))
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.parametrize("kind", ["chat", "responses"])
def test_a_client_closing_a_stream_cancels_the_engines_request(surface: Cluster, kind: str) -> None:
    wait_for(lambda: _running(surface, "v-chat") == 0 or None, 10, "the engine is idle")
    sdk = client(surface)
    stream: openai.Stream[object]
    if kind == "chat":
        stream = sdk.chat.completions.create(  # type: ignore[assignment]
            model="v-chat", messages=[{"role": "user", "content": "Count."}], max_tokens=3000, stream=True
        )
    else:
        stream = sdk.responses.create(  # type: ignore[assignment]
            model="v-chat", input="Count.", max_output_tokens=3000, stream=True
        )
    next(iter(stream))
    assert _running(surface, "v-chat") == 1
    stream.close()
    closed = time.monotonic()
    wait_for(lambda: _running(surface, "v-chat") == 0 or None, 5, "the engine cancels the request")
    assert time.monotonic() - closed < 3  # 3,000 tokens take 6 s on the stand-in's 2 ms a token


def test_a_stopped_cluster_answers_503_and_serves_again_when_started(surface: Cluster) -> None:
    surface.admin.request("PUT", "/api/serving", {"stopped": True})
    try:
        with pytest.raises(openai.APIStatusError) as caught:
            client(surface).responses.create(model="s-chat", input="hi")
        assert caught.value.status_code == 503 and caught.value.code == "system_stopped"
    finally:
        surface.admin.request("PUT", "/api/serving", {"stopped": False})
    surface.wait_ready("s-chat", 60)
    conformance.responses(client(surface), "s-chat")
