"""A real control plane, agent, llama-server and SmolLM2, driven through the openai SDK."""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request

import openai
import pytest

from llmgw.cli.up import DEFAULT_MODEL
from llmgw.testing.cluster import Cluster, wait_for

pytestmark = pytest.mark.e2e


def client(cluster: Cluster, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=key or cluster.key, max_retries=0, timeout=60)


def post(cluster: Cluster, path: str, body: bytes, key: str | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{cluster.url}{path}",
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {key or cluster.key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_chat_completion_answers(cluster: Cluster) -> None:
    answer = client(cluster).chat.completions.create(
        model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
    )
    assert answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens > 0


def test_stream_arrives_in_chunks(cluster: Cluster) -> None:
    stream = client(cluster).chat.completions.create(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=12,
        stream=True,
    )
    pieces = [
        chunk.choices[0].delta.content for chunk in stream if chunk.choices and chunk.choices[0].delta.content
    ]
    assert len(pieces) > 1


def test_models_lists_the_catalog(cluster: Cluster) -> None:
    assert [m.id for m in client(cluster).models.list()] == [DEFAULT_MODEL]


def test_wrong_key_gets_401(cluster: Cluster) -> None:
    with pytest.raises(openai.AuthenticationError):
        client(cluster, key="sk-llmgw-wrong").chat.completions.create(
            model=DEFAULT_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )


def test_unknown_model_gets_404(cluster: Cluster) -> None:
    with pytest.raises(openai.NotFoundError):
        client(cluster).chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "hi"}]
        )


def test_malformed_json_gets_400(cluster: Cluster) -> None:
    status, body = post(cluster, "/v1/chat/completions", b"{not json")
    assert status == 400 and body["error"]["message"]


def test_bad_model_definition_names_the_fields(cluster: Cluster) -> None:
    with pytest.raises(Exception) as caught:
        cluster.admin.request(
            "POST",
            "/api/models",
            {"name": "bad", "source": {"sha256": "xyz"}, "replicas": {"min": 3, "max": 1}, "colour": "blue"},
        )
    fields = {field for field, _ in caught.value.problems}  # type: ignore[attr-defined]
    assert {"source.sha256", "replicas", "colour"} <= fields


def test_killed_engine_comes_back_and_serves(cluster: Cluster) -> None:
    before = cluster.wait_ready(DEFAULT_MODEL)
    pid = _engine_pid(before["port"])
    os.kill(pid, signal.SIGKILL)
    wait_for(
        lambda: any(
            r["restarts"] > before["restarts"] and r["state"] == "ready"
            for r in cluster.replicas(DEFAULT_MODEL)
        ),
        120,
        "the replica restarted and ready",
    )
    test_chat_completion_answers(cluster)


def test_agent_restart_resumes_serving(cluster: Cluster) -> None:
    cluster.wait_ready(DEFAULT_MODEL)
    cluster.kill("agent-node1")
    wait_for(
        lambda: all(r["state"] != "ready" for r in cluster.replicas(DEFAULT_MODEL)),
        30,
        "the control plane saw the node go",
    )
    cluster.start_agent("node1")
    cluster.wait_ready(DEFAULT_MODEL, 120)
    test_chat_completion_answers(cluster)


def _engine_pid(port: int) -> int:
    """The llama-server process listening on ``port``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"llama-server") and str(port).encode() in argv:
            return int(entry)
    raise AssertionError(f"no llama-server on port {port}")
