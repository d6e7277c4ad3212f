"""Knowledge collections on a real cluster: all-MiniLM-L6-v2 (converted to GGUF) served by
llama-server with ``serves: embeddings``, embedded through the control plane's own /v1 with its
own key; a Markdown and a PDF document uploaded and found by vector, keyword and hybrid search;
another team's user gets 404 for the collection. Then the whole request path: a chat request to
SmolLM2 (llama-server) through the ``openai`` SDK naming a collection is answered with the passage
in its prompt and the document in ``sources``; another team's key gets 404 for it."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from llmgw.cli.up import DEFAULT_MODEL
from llmgw.client.admin import AdminClient
from llmgw.errors import LlmgwError
from llmgw.testing.cluster import Cluster
from llmgw.testing.embedding_model import embedding_model
from llmgw.testing.pdfs import text_pdf

pytestmark = pytest.mark.e2e

EMBED = "minilm"

GUIDE = """# Operations guide

## Backups

Backups run every night at two o'clock and are kept for thirty days on the archive server.

## Certificates

The TLS certificates are renewed automatically sixty days before they expire.

## Holidays

The office is closed between Christmas and New Year; the support line stays open.
"""

MANUAL = [
    ["Pump maintenance"],
    ["The coolant pump must be lubricated with synthetic grease every three months."],
]


@pytest.fixture(scope="module")
def kb(tmp_path_factory: pytest.TempPathFactory, engine_cache: Path, model_file: Path) -> Iterator[Cluster]:
    model = embedding_model(engine_cache)
    with Cluster(tmp_path_factory.mktemp("kb"), engine_cache) as running:
        running.start_server()
        # one thread, as docs/knowledge.md advises for an embedding model on shared CPU cores
        profile = {
            "ctx_size": 512,
            "parallel": 1,
            "serves": "embeddings",
            "pooling": "mean",
            "args": ["--threads", "1"],
        }
        running.add_model(EMBED, model, profile)
        running.add_model(DEFAULT_MODEL, model_file, {"ctx_size": 2048, "parallel": 1})
        running.start_agent("node1")
        running.wait_ready(EMBED, 180)
        running.wait_ready(DEFAULT_MODEL, 180)
        for path, body in (
            ("/api/orgs", {"name": "acme"}),
            ("/api/teams", {"org": "acme", "name": "ml"}),
            ("/api/teams", {"org": "acme", "name": "web"}),
            ("/api/projects", {"org": "acme", "team": "ml", "name": "chat"}),
            ("/api/projects", {"org": "acme", "team": "web", "name": "site"}),
        ):
            running.admin.request("POST", path, body)
        yield running


def _user(cluster: Cluster, name: str, scope: str) -> AdminClient:
    cluster.admin.request("POST", "/api/users", {"name": name})
    cluster.admin.request("PUT", f"/api/users/{name}/roles", {"role": "member", "scope": scope})
    token = cluster.admin.request("POST", f"/api/users/{name}/tokens", {"name": "t"})["token"]
    return AdminClient(cluster.url, token)


def _upload(client: AdminClient, name: str, data: bytes) -> dict[str, object]:
    path = f"/api/knowledge/collections/ops/documents/{name}"
    stored: dict[str, object] = client.request("PUT", path, data=io.BytesIO(data), length=len(data))
    return stored


def _search(client: AdminClient, query: str, mode: str) -> list[dict[str, object]]:
    body = {"collections": ["ops"], "query": query, "mode": mode, "limit": 3}
    found: list[dict[str, object]] = client.request("POST", "/api/knowledge/search", body)
    return found


def test_documents_are_embedded_by_the_served_model_and_found(kb: Cluster) -> None:
    mia = _user(kb, "mia", "team:acme/ml")
    made = mia.request(
        "POST",
        "/api/knowledge/collections",
        {"name": "ops", "owner": "team:acme/ml", "embedding_model": EMBED},
    )
    assert made["embedding_model"] == EMBED
    guide = _upload(mia, "guide.md", GUIDE.encode())
    assert guide["passages"] >= 3
    pdf = text_pdf(MANUAL)
    manual = _upload(mia, "manual.pdf", pdf)
    assert manual["kind"] == "pdf"
    # a paraphrase, no word of which is in the passage: only the vectors find it
    vector = _search(mia, "how often does the grease go on the pump?", "vector")
    assert vector[0]["document"] == "manual.pdf"
    keyword = _search(mia, "certificates renewed", "keyword")
    assert "sixty days" in str(keyword[0]["text"])
    hybrid = _search(mia, "when are the backups made and how long kept", "hybrid")
    assert "Backups run every night" in str(hybrid[0]["text"])


def test_another_teams_user_is_told_the_collection_does_not_exist(kb: Cluster) -> None:
    wes = _user(kb, "wes", "team:acme/web")
    with pytest.raises(LlmgwError, match="collection 'ops' does not exist"):
        _search(wes, "backups", "hybrid")
    assert wes.request("GET", "/api/knowledge/collections") == []


FACT = """# Festivals

## Zorblat

The Zorblat lantern festival is held every year in the harbour town of Quillmere, on the
ninth of March, when the fishermen float eight hundred paper lanterns out to sea.
"""
QUESTION = "Where is the Zorblat lantern festival held?"


def _openai(kb: Cluster, place: str) -> openai.OpenAI:
    key = kb.admin.request("POST", "/api/keys", {"name": place.replace("/", "-"), "place": place})["key"]
    return openai.OpenAI(base_url=f"{kb.url}/v1", api_key=key, timeout=120, max_retries=0)


def test_a_chat_request_naming_a_collection_gets_its_passage_and_sources(kb: Cluster) -> None:
    made = kb.admin.request(
        "POST",
        "/api/knowledge/collections",
        {"name": "lore", "owner": "team:acme/ml", "embedding_model": EMBED},
    )
    assert made["name"] == "lore"
    path = "/api/knowledge/collections/lore/documents/festivals.md"
    kb.admin.request("PUT", path, data=io.BytesIO(FACT.encode()), length=len(FACT.encode()))
    ml = _openai(kb, "project:acme/ml/chat")
    messages = [{"role": "user", "content": QUESTION}]
    plain = ml.chat.completions.create(model=DEFAULT_MODEL, messages=messages, max_tokens=8)  # type: ignore[arg-type]
    answer = ml.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=8,
        extra_body={"knowledge": {"collections": ["lore"], "limit": 1}},
    )
    sources = (answer.model_extra or {})["sources"]
    assert [(s["collection"], s["document"]) for s in sources] == [("lore", "festivals.md")]
    assert "Quillmere" in sources[0]["text"]
    assert "sources" not in (plain.model_extra or {})
    # the engine counted the passage in the prompt: the header and the passage are ~80 tokens more
    assert plain.usage is not None and answer.usage is not None
    assert answer.usage.prompt_tokens >= plain.usage.prompt_tokens + 50
    web = _openai(kb, "project:acme/web/site")
    with pytest.raises(openai.NotFoundError) as refused:
        web.chat.completions.create(
            model=DEFAULT_MODEL,
            messages=messages,  # type: ignore[arg-type]
            extra_body={"knowledge": {"collections": ["lore"]}},
        )
    assert refused.value.code == "collection_not_found"
    assert "collection 'lore' does not exist" in refused.value.message
