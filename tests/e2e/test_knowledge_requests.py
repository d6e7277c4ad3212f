"""Knowledge at request time end to end: the openai SDK through a real control plane to a vLLM stand-in.

The control plane runs with an in-memory search (:mod:`llmgw.testing.knowledge`,
the seam until the collections' index is wired) over two collections of two
projects holding the same passage. A key of each project asks the same question
of its own collection: each answer carries its sources (whole and streamed, read
from the SDK's ``model_extra``); the engine is sent the passages and a
``cache_salt`` per collection, so the same prompt start is cached apart: the
second project's request finds nothing of the first's in the engine's prefix
cache, while the first project's repeat does. A collection of another project
answers 404 as one that does not exist. The control plane runs two gateway
workers: they search nothing themselves, and hand such requests whole to it.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from llmgw.agent.config import EngineSettings, PythonEngineSettings
from llmgw.controlplane.config import save_server_config
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.nvidia_smi_standin import H100_80G, install_fake_nvidia_smi
from llmgw.testing.standin_programs import write_standins

pytestmark = pytest.mark.e2e

MODEL = "kb-vllm"
ALPHA, BETA = "project:acme/alpha/app", "project:acme/beta/app"
PASSAGE = "Holidays are booked in the portal under Time off, at least two weeks ahead."
COLLECTIONS = {
    "alpha-handbook": {"owner": ALPHA, "documents": {"handbook.md": [PASSAGE, "Expenses are paid monthly."]}},
    "beta-handbook": {"owner": BETA, "documents": {"handbook.md": [PASSAGE]}},
}
QUESTION = "How are holidays booked?"


@pytest.fixture(scope="module")
def kb_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, str, str]]:
    home = tmp_path_factory.mktemp("kb")
    programs = write_standins(home / "standins")
    collections = home / "collections.json"
    collections.write_text(json.dumps(COLLECTIONS))
    running = Cluster(home / "cluster", home / "cache")
    running.config.gateway.workers = 2
    save_server_config(running.config, running.home / "server.yaml")
    with running:
        running.start(
            "server",
            "--config",
            str(running.config_path("cp1")),
            "--collections",
            str(collections),
            module="llmgw.testing.knowledge",
        )
        wait_for(lambda: running.admin.get("/api/status"), 30, "the control plane answers")
        blob = running.upload(filename="config.json", data=b'{"architectures": ["LlamaForCausalLM"]}')
        running.admin.request(
            "POST",
            "/api/models",
            {
                "name": MODEL,
                "source": {"sha256": blob["sha256"], "filename": "config.json", "format": "safetensors"},
                "profile": {"engine": "vllm", "ctx_size": 4096, "parallel": 2},
                "replicas": {"min": 1, "max": 1},
            },
        )
        running.admin.create_unit("orgs", {"name": "acme"})
        keys = []
        for team in ("alpha", "beta"):
            running.admin.create_unit("teams", {"org": "acme", "name": team})
            running.admin.create_unit("projects", {"org": "acme", "team": team, "name": "app"})
            keys.append(running.admin.create_key(team, place=f"project:acme/{team}/app").key)
        running.add_node(
            "node1",
            nvidia_smi=str(install_fake_nvidia_smi(home / "smi", [H100_80G])),
            engines=EngineSettings(vllm=PythonEngineSettings(program=str(programs.vllm))),
        )
        running.start_agent("node1")
        running.wait_ready(MODEL, 120)
        yield running, keys[0], keys[1]


def _hits(replica: dict[str, Any]) -> float:
    """The stand-in's own prefix-cache hits (read from the engine, not through llmgw)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{replica['port']}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "vllm:prefix_cache_hits_total"
    )


def _ask(sdk: OpenAI, collection: str, **extra: Any) -> Any:
    return sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=2,
        extra_body={"knowledge": {"collections": [collection], "limit": 1}},
        **extra,
    )


def test_each_project_gets_its_sources_and_its_own_cache(kb_cluster: tuple[Cluster, str, str]) -> None:
    cluster, alpha_key, beta_key = kb_cluster
    [replica] = cluster.replicas(MODEL)
    alpha = OpenAI(base_url=f"{cluster.url}/v1", api_key=alpha_key, max_retries=0)
    beta = OpenAI(base_url=f"{cluster.url}/v1", api_key=beta_key, max_retries=0)

    def by_a_worker() -> bool:
        raw = alpha.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
        return bool(raw.headers.get("x-llmgw-worker"))

    wait_for(by_a_worker, 30, "the gateway workers answer /v1")
    raw = alpha.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=2,
        extra_body={"knowledge": {"collections": ["alpha-handbook"], "limit": 1}},
    )
    assert raw.headers.get("x-llmgw-worker"), "a worker took the request and handed it to its control plane"
    answer = raw.parse()
    [source] = (answer.model_extra or {})["sources"]
    assert source["collection"] == "alpha-handbook" and source["document"] == "handbook.md"
    assert source["position"] == 0 and source["text"] == PASSAGE
    plain = alpha.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=2
    )
    assert "sources" not in (plain.model_extra or {})
    assert answer.usage is not None and plain.usage is not None
    assert answer.usage.prompt_tokens > plain.usage.prompt_tokens + 20  # the passage went in

    before = _hits(replica)
    _ask(alpha, "alpha-handbook")
    repeat_hits = _hits(replica) - before
    assert repeat_hits >= 16, "the same project's repeat found its prompt's start cached"

    before = _hits(replica)
    chunks = list(_ask(beta, "beta-handbook", stream=True))
    assert _hits(replica) == before, "the other project's request found nothing of the first's cached"
    assert [s["collection"] for s in (chunks[0].model_extra or {})["sources"]] == ["beta-handbook"]
    assert all("sources" not in (c.model_extra or {}) for c in chunks[1:])

    with pytest.raises(openai.NotFoundError) as caught:
        _ask(beta, "alpha-handbook")
    assert caught.value.code == "collection_not_found"
    with pytest.raises(openai.NotFoundError) as unknown:
        _ask(beta, "gamma-handbook")
    assert caught.value.message.replace("alpha", "X") == unknown.value.message.replace("gamma", "X")
