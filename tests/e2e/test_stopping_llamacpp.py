"""Work nobody waits for is stopped on real llama-server (SmolLM2, one slot).

A stream whose client leaves after its first event frees the engine's only
slot: a second request is answered at once, not after the first's 2,000
tokens. A whole answer running past the model's ``request_timeout_s`` is
answered 504 ``request_timeout`` and frees the slot too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmgw.testing.cluster import Cluster, wait_for

pytestmark = pytest.mark.e2e

MODEL = "smol-limited"
LIMIT_S = 10.0
"""The model's time limit on its engine: far under the long request's generation (about 2,000
tokens), far over a short answer."""
LONG = {"max_tokens": 2000, "ignore_eos": True}
"""A request that keeps the engine's one slot busy for minutes on a CPU."""
PROMPTLY_S = 8.0
"""A short answer, once the slot is free (under a second alone on the CPU)."""


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory, engine_cache: Path, model_file: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("stopping"), engine_cache) as running:
        running.start_server()
        running.add_model(MODEL, model_file, {"ctx_size": 2048, "parallel": 1, "request_timeout_s": LIMIT_S})
        running.create_key()
        running.start_agent("node1")
        running.wait_ready(MODEL, 180)
        yield running


def chat(**fields: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Count to a thousand."}], **fields}


def short_answer_takes(client: httpx.Client) -> float:
    started = time.monotonic()
    answer = client.post("/v1/chat/completions", json=chat(max_tokens=8), timeout=120)
    assert answer.status_code == 200, answer.text
    return time.monotonic() - started


def gateway(cluster: Cluster) -> httpx.Client:
    return httpx.Client(base_url=cluster.url, headers={"Authorization": f"Bearer {cluster.key}"})


def test_a_client_leaving_its_stream_frees_the_engine_for_the_next_request(smol: Cluster) -> None:
    with gateway(smol) as client:
        body = chat(stream=True, **LONG)
        with client.stream("POST", "/v1/chat/completions", json=body, timeout=60) as long:
            assert long.status_code == 200
            next(long.iter_lines())  # the engine is generating in its only slot
        took = short_answer_takes(client)
    assert took < PROMPTLY_S, f"the next request waited {took:.1f} s: the engine kept working for nobody"


def test_a_request_past_the_models_time_limit_answers_504_and_frees_the_engine(smol: Cluster) -> None:
    with gateway(smol) as client:
        started = time.monotonic()
        answer = client.post("/v1/chat/completions", json=chat(**LONG), timeout=120)
        took = time.monotonic() - started
        assert answer.status_code == 504, answer.text
        assert answer.json()["error"]["code"] == "request_timeout"
        assert "request_timeout_s" in answer.json()["error"]["message"]
        assert LIMIT_S <= took < LIMIT_S + 5
        after = short_answer_takes(client)
    assert after < PROMPTLY_S, f"the next request waited {after:.1f} s: the engine kept the timed-out one"


def _usage(cluster: Cluster, key_name: str) -> tuple[int, int]:
    """The requests and prompt tokens of the key named ``key_name`` in /api/usage."""
    lines = cluster.admin.usage([("group_by", "key")]).lines
    found = [line for line in lines if line.key_name == key_name]
    return (sum(line.requests for line in found), sum(line.prompt_tokens for line in found))


def test_a_stream_left_early_is_billed_its_prompt_as_the_engine_counts_it(smol: Cluster) -> None:
    """llama-server's /tokenize takes text: the chat is rendered by its /apply-template, then counted,
    and the count is the one the engine's own usage gives for the same chat."""
    key = smol.admin.create_key("left-early").key
    messages = [{"role": "user", "content": "Name three rivers of Europe, one per line."}]
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=smol.url, headers=auth) as client:
        whole = client.post("/v1/chat/completions", json=chat(messages=messages, max_tokens=2), timeout=60)
        assert whole.status_code == 200, whole.text
        prompt = whole.json()["usage"]["prompt_tokens"]
        body = chat(messages=messages, stream=True, **LONG)
        with client.stream("POST", "/v1/chat/completions", json=body, timeout=60) as left:
            assert left.status_code == 200
            next(left.iter_lines())

    def both() -> tuple[int, int] | None:
        seen = _usage(smol, "left-early")
        return seen if seen[0] == 2 else None

    _, prompts = wait_for(both, 30, "the whole answer and the stream left early are counted")
    assert prompts == 2 * prompt > 0, "the stream left early is billed the prompt the engine counted"
