"""A control plane serving a model from an Anthropic provider over TLS: the Messages API stand-in on
https with a test CA that ``gateway.provider_ca_file`` in server.yaml names; chat completions in
and out, whole and streamed, with usage; a provider slower than its first-byte timeout is a 504."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmgw.controlplane.config import save_server_config
from llmgw.testing.anthropic_server import AnthropicStandin, anthropic_in_thread
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.git_https import self_signed

pytestmark = pytest.mark.e2e

CLAUDE = "claude-hosted"
SLOW = "claude-slow"


@pytest.fixture(scope="module")
def standin() -> AnthropicStandin:
    return AnthropicStandin(key="sk-ant-e2e-secret")


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, engine_cache: Path, standin: AnthropicStandin
) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("anthropic")
    cert, key = self_signed(home)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    slow = AnthropicStandin(key=standin.key, delay_s=5)
    with anthropic_in_thread(standin, tls) as url, anthropic_in_thread(slow, tls) as slow_url:
        with Cluster(home / "cluster", engine_cache) as running:
            running.config.gateway.provider_ca_file = str(cert)
            save_server_config(running.config, running.home / "server.yaml")
            running.start_server()
            for name, base, timeouts in ((CLAUDE, url, {}), (SLOW, slow_url, {"first_byte_s": 0.5})):
                running.admin.request("POST", "/api/models", {"name": name, "provider": {
                    "api": "anthropic", "base_url": base, "model": "claude-upstream", "key": standin.key,
                    "timeouts": timeouts}})  # fmt: skip
            running.create_key()
            yield running


def test_chat_completions_through_an_anthropic_provider_over_tls(
    served: Cluster, standin: AnthropicStandin
) -> None:
    headers = {"Authorization": f"Bearer {served.key}"}
    chat = {"model": CLAUDE, "messages": [{"role": "user", "content": "over tls"}], "max_tokens": 16}
    with httpx.Client(base_url=f"{served.url}/v1", headers=headers, timeout=30) as http:
        answer = http.post("/chat/completions", json=chat)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == "Echo: over tls"
        with http.stream("POST", "/chat/completions", json={**chat, "stream": True}) as stream:
            lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and any('"content":"over "' in line for line in lines)
    assert standin.requests[-1].body["model"] == "claude-upstream"
    lines_of = lambda: [  # noqa: E731
        line
        for line in served.admin.usage([("group_by", "model")]).lines
        if line.model == CLAUDE and line.requests >= 2
    ]
    [line] = wait_for(lines_of, 30, "the usage of the Anthropic provider's model is counted")
    assert (line.prompt_tokens, line.completion_tokens) == (4, 6)
    log = (served.home / "logs" / "server.log").read_text(errors="replace")
    assert standin.key not in log


def test_a_provider_slower_than_its_first_byte_timeout_is_a_504(served: Cluster) -> None:
    headers = {"Authorization": f"Bearer {served.key}"}
    with httpx.Client(base_url=f"{served.url}/v1", headers=headers, timeout=30) as http:
        answer = http.post(
            "/chat/completions", json={"model": SLOW, "messages": [{"role": "user", "content": "x"}]}
        )
    assert answer.status_code == 504
    assert "sent no answer within 0.5 s; retry" in answer.json()["error"]["message"]
