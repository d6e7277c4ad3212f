"""Metrics and logs of real processes: a control plane and an agent running a stand-in llama-server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmgw.agent.config import load_agent_config
from llmgw.controlplane.config import save_server_config
from llmgw.core.engines import DEFAULT_ENGINE
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.llama_server_standin import PROMPT_TOKENS, write_launcher

pytestmark = pytest.mark.e2e

MODEL = "observed-chat"
OWNER = "project:obs/platform/chat"
"""Where the test's key sits: requests count under it."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("observability")
    with Cluster(home / "cluster", home / "cache") as running:
        running.config.gateway.access_log = True
        save_server_config(running.config, running.home / "server.yaml")
        running.start("server", "server", "run", "--config", str(running.config_path("cp1")), "--log-json")
        wait_for(lambda: running.admin.get("/api/status"), 30, "the control plane answers")
        running.add_standin_model(MODEL)
        running.admin.create_unit("orgs", {"name": "obs"})
        running.admin.create_unit("teams", {"org": "obs", "name": "platform"})
        running.admin.create_unit("projects", {"org": "obs", "team": "platform", "name": "chat"})
        running.key = running.admin.create_key("obs", place=OWNER).key
        launcher = write_launcher(home / "bin" / "llama-server")
        agent_yaml = running.add_node("node1", engines={"llamacpp": {"binary": str(launcher)}})
        running.start("agent-node1", "agent", "run", "--config", str(agent_yaml), "--log-json")
        running.wait_ready(MODEL, 60)
        yield running


def scrape(url: str, token: str = "") -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``url``'s /metrics by sample (``token``: a control plane's, which wants one)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"{url}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=5) as answer:
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def agent_url(cluster: Cluster) -> str:
    config = load_agent_config(cluster.home / "nodes" / "node1" / "agent.yaml")
    return f"http://{config.metrics.host}:{config.metrics.port}"


def test_the_agent_serves_its_engine_starts_and_weights_fetched(cluster: Cluster) -> None:
    metrics = wait_for(lambda: scrape(agent_url(cluster)), 30, "the agent's /metrics answers")

    assert metrics[("llmgw_agent_engine_starts_total", (("engine", DEFAULT_ENGINE),))] >= 1
    assert metrics[("llmgw_agent_weights_fetched_bytes_total", ())] == len(b"GGUF stand-in\n")
    assert not any(name.startswith("llmgw_gateway_") for name, _ in metrics), "the agent serves no /v1"


def test_the_control_plane_counts_a_request_by_project_and_shows_the_cluster(cluster: Cluster) -> None:
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=cluster.key, max_retries=0, timeout=30)
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])

    labels = (("code", "200"), ("model", MODEL), ("project", OWNER))
    counted = ("llmgw_gateway_requests_total", labels)
    metrics = wait_for(
        lambda: (found := scrape(cluster.url, cluster.token)).get(counted) and found,
        30,
        "the request is counted",
    )
    tokens = (("model", MODEL), ("project", OWNER))
    assert metrics[("llmgw_gateway_prompt_tokens_total", tokens)] == PROMPT_TOKENS
    assert metrics[("llmgw_nodes_connected", ())] == 1
    assert metrics[("llmgw_replicas", (("model", MODEL), ("state", "ready")))] == 1
    assert metrics[("llmgw_leader", ())] == 1 and metrics[("llmgw_lease_epoch", ())] >= 1
    assert metrics[("llmgw_reconcile_duration_seconds_count", ())] >= 1
    assert metrics[("llmgw_store_query_duration_seconds_count", ())] >= 1


def test_the_control_plane_metrics_are_refused_without_a_token_and_to_a_teams_admin(cluster: Cluster) -> None:
    with pytest.raises(urllib.error.HTTPError) as anonymous:
        scrape(cluster.url)
    body = anonymous.value.read().decode()
    assert anonymous.value.code == 401 and MODEL not in body and OWNER not in body
    cluster.admin.request("POST", "/api/users", {"name": "tess"})
    team_admin_role = {"role": "team-admin", "scope": "team:obs/platform"}
    cluster.admin.request("PUT", "/api/users/tess/roles", team_admin_role)
    token = cluster.admin.request("POST", "/api/users/tess/tokens", {"name": "laptop"})["token"]
    with pytest.raises(urllib.error.HTTPError) as team_admin:  # tokens and roles reload as /api changes them
        scrape(cluster.url, token)
    assert team_admin.value.code == 403 and OWNER not in team_admin.value.read().decode()
    cluster.admin.request("PUT", "/api/users/tess/roles", {"role": "viewer", "scope": ""})
    metrics = scrape(cluster.url, token)
    assert metrics[("llmgw_replicas", (("model", MODEL), ("state", "ready")))] == 1


def test_the_json_access_log_names_the_request_project_model_and_replica(cluster: Cluster) -> None:
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=cluster.key, max_retries=0, timeout=30)
    client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], extra_headers={"x-request-id": "e2e-req-1"}
    )

    def line() -> dict[str, object] | None:
        for text in cluster.log("server").read_text().splitlines():
            if text.startswith("{") and '"e2e-req-1"' in text:
                entry: dict[str, object] = json.loads(text)
                if entry["logger"] == "llmgw.access":
                    return entry
        return None

    entry = wait_for(line, 30, "the access line of the request")
    assert (entry["project"], entry["model"], entry["status"]) == (OWNER, MODEL, 200)
    assert str(entry["replica"]).startswith(MODEL.split("-")[0]) or entry["replica"]
    agent_lines = [
        json.loads(t) for t in cluster.log("agent-node1").read_text().splitlines() if t.startswith("{")
    ]
    assert agent_lines and all(e.get("node") == "node1" for e in agent_lines)
