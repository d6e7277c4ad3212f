"""A second llmgw as an OpenAI-compatible provider: a front cluster with no node of its own serves
SmolLM2 from a back cluster (real llama-server), under its own keys and usage, whole and streamed;
a cluster model with no replica falls back to the provider; the back cluster's key is in no log
and no /api answer of the front one."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from llmgw.adminapi.usage import UsageLine
from llmgw.cli.main import app
from llmgw.cli.up import DEFAULT_MODEL
from llmgw.testing.cluster import Cluster, wait_for

pytestmark = pytest.mark.e2e

HOSTED = "hosted-smol"
BIG = "big-on-h100"
CHAT = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def back(tmp_path_factory: pytest.TempPathFactory, engine_cache: Path, model_file: Path) -> Iterator[Cluster]:
    """The provider: an llmgw serving SmolLM2 on real llama-server."""
    with Cluster(tmp_path_factory.mktemp("back"), engine_cache) as running:
        running.start_server()
        running.add_model(DEFAULT_MODEL, model_file, {"ctx_size": 2048, "parallel": 2})
        running.create_key("front")
        running.start_agent("node1")
        running.wait_ready(DEFAULT_MODEL, 180)
        yield running


@pytest.fixture(scope="module")
def front(
    tmp_path_factory: pytest.TempPathFactory, engine_cache: Path, model_file: Path, back: Cluster
) -> Iterator[Cluster]:
    """A control plane without nodes: one model served by ``back``, one that no node here can run."""
    home = tmp_path_factory.mktemp("front")
    key_file = home / "back.key"
    key_file.write_text(back.key + "\n")
    with Cluster(home, engine_cache) as running:
        running.start_server()
        added = CliRunner().invoke(
            app,
            ["ctl", "model", "add", HOSTED, "--provider", f"{back.url}/v1", "--provider-model", DEFAULT_MODEL,
             "--key-file", str(key_file), "--url", running.url, "--token", running.token],
        )  # fmt: skip
        assert added.exit_code == 0, added.output
        blob = running.upload(model_file)
        running.admin.request("POST", "/api/models", {
            "name": BIG, "source": {"sha256": blob["sha256"], "filename": model_file.name},
            "profile": {"gpu_class": "h100", "ctx_size": 2048}, "fallbacks": [HOSTED],
        })  # fmt: skip
        running.create_key()
        yield running


def client(cluster: Cluster) -> httpx.Client:
    return httpx.Client(
        base_url=f"{cluster.url}/v1", headers={"Authorization": f"Bearer {cluster.key}"}, timeout=60
    )


def test_the_front_cluster_answers_from_the_back_cluster_whole_and_streamed(
    front: Cluster, back: Cluster
) -> None:
    with client(front) as http:
        answer = http.post("/chat/completions", json={**CHAT, "model": HOSTED})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["choices"][0]["message"]["content"]
        assert body["usage"]["completion_tokens"] > 0
        with http.stream(
            "POST", "/chat/completions", json={**CHAT, "model": HOSTED, "stream": True}
        ) as stream:
            assert stream.status_code == 200
            lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        assert not any('"usage"' in line for line in lines)  # the client did not ask; the gateway did

    def counted() -> list[UsageLine]:
        lines = front.admin.usage([("group_by", "model")]).lines
        return [line for line in lines if line.model == HOSTED and line.requests >= 2]

    [line] = wait_for(counted, 30, "the front cluster counts the provider model's usage")
    assert line.completion_tokens > 0
    metrics = front.metrics()
    assert f'llmgw_provider_requests_total{{code="200",model="{HOSTED}"}}' in metrics


def test_a_cluster_model_with_no_replica_falls_back_to_the_provider(front: Cluster) -> None:
    with client(front) as http:
        answer = http.post("/chat/completions", json={**CHAT, "model": BIG})
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-llmgw-served-by"] == HOSTED
        assert answer.json()["choices"][0]["message"]["content"]


def test_the_back_clusters_key_is_in_no_log_and_no_api_answer(front: Cluster, back: Cluster) -> None:
    shown = front.admin.request("GET", f"/api/models/{HOSTED}")
    assert shown["definition"]["provider"]["key"] == "set"
    answers = json.dumps(
        [front.admin.request("GET", path) for path in ("/api/models", "/api/audit", "/api/status")]
    )
    assert back.key not in answers
    for log in (front.home / "logs").glob("*.log"):
        assert back.key not in log.read_text(errors="replace"), log
    status = CliRunner().invoke(
        app, ["ctl", "model", "show", HOSTED, "--url", front.url, "--token", front.token]
    )
    assert "key: set" in status.output and back.key not in status.output


def test_ctl_status_and_models_show_the_provider(front: Cluster, back: Cluster) -> None:
    options = ["--url", front.url, "--token", front.token]
    status = CliRunner().invoke(app, ["ctl", "status", *options], env={"COLUMNS": "200"})
    assert f"provider {HOSTED}" in status.output
    assert f"openai {DEFAULT_MODEL} at 127.0.0.1:{back.http_port}" in status.output
    listed = CliRunner().invoke(app, ["ctl", "models", *options], env={"COLUMNS": "200"})
    assert f"openai {DEFAULT_MODEL} at 127.0.0.1:{back.http_port}" in listed.output


def test_the_provider_hop_costs_little_over_calling_the_back_cluster(front: Cluster, back: Cluster) -> None:
    def timed(http: httpx.Client, model: str) -> float:
        started = time.perf_counter()
        assert http.post("/chat/completions", json={**CHAT, "model": model}).status_code == 200
        return time.perf_counter() - started

    with client(back) as direct, client(front) as through:
        timed(direct, DEFAULT_MODEL), timed(through, HOSTED)  # connections opened
        back_s = statistics.median(timed(direct, DEFAULT_MODEL) for _ in range(7))
        front_s = statistics.median(timed(through, HOSTED) for _ in range(7))
    print(f"\nmedian: back cluster {back_s * 1000:.1f} ms, through the front cluster {front_s * 1000:.1f} ms")
    assert front_s < back_s + 0.5
