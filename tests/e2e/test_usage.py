"""Usage on a real cluster (control plane, agent, the llama-server stand-in): requests through the
gateway with a project's key show up in /api/usage under the project, with tokens, time to first
token and tokens per second — and a user of another team does not see them."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from llmgw.adminapi.usage import UsageLine
from llmgw.client.admin import AdminClient
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.llama_server_standin import PROMPT_TOKENS, STREAM_CHUNKS, write_launcher

pytestmark = pytest.mark.e2e

MODEL = "standin-usage"
CHAT = "project:acme/ml/chat"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("usage")
    with Cluster(home / "cluster", home / "cache") as running:
        running.start_server()
        weights = home / "weights.gguf"
        weights.write_bytes(b"GGUF stand-in for usage\n")
        running.add_model(MODEL, weights)
        launcher = write_launcher(home / "bin" / "llama-server")
        running.add_node("node1", engines={"llamacpp": {"binary": str(launcher)}})
        running.start_agent("node1")
        running.wait_ready(MODEL, 60)
        yield running


def test_requests_show_in_usage_under_their_project_with_tokens_and_ttft(cluster: Cluster) -> None:
    admin = cluster.admin
    admin.create_unit("orgs", {"name": "acme"})
    for team, project in (("ml", "chat"), ("web", "shop")):
        admin.create_unit("teams", {"org": "acme", "name": team})
        admin.create_unit("projects", {"org": "acme", "team": team, "name": project})
    key = admin.create_key("chat-ci", place=CHAT).key
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=key, max_retries=0, timeout=30)
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages)
    assert whole.usage is not None
    for _ in range(2):
        assert (
            len(list(client.chat.completions.create(model=MODEL, messages=messages, stream=True)))
            == STREAM_CHUNKS
        )

    query = [("group_by", "project"), ("group_by", "model"), ("by", "hour")]

    def counted() -> UsageLine | None:
        lines = [line for line in admin.usage(query).lines if line.model == MODEL]
        return lines[0] if lines and lines[0].requests == 3 else None

    line = wait_for(counted, 30, "the three requests are in /api/usage")
    assert (line.project, line.errors) == (CHAT, 0)
    assert line.prompt_tokens == 3 * PROMPT_TOKENS
    assert line.completion_tokens == whole.usage.completion_tokens + 2 * STREAM_CHUNKS
    assert line.ttft_mean_ms is not None and line.ttft_mean_ms > 0
    assert line.tokens_per_s is not None and line.tokens_per_s > 0

    admin.create_user("wes")
    admin.bind_role("wes", "viewer", "team:acme/web")
    as_wes = AdminClient(cluster.url, admin.create_token("wes", "e2e", 3600).token)
    assert as_wes.usage(query).lines == []
    admin.create_user("mia")
    admin.bind_role("mia", "viewer", "team:acme/ml")
    as_mia = AdminClient(cluster.url, admin.create_token("mia", "e2e", 3600).token)
    assert [(seen.project, seen.requests) for seen in as_mia.usage(query).lines] == [(CHAT, 3)]
