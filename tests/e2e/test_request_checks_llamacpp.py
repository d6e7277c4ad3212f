"""Bodies of every shape, valid and broken, through a real gateway on real llama-server (SmolLM2):
each is answered 2xx or 4xx, never 5xx; and the bodies that kept llama-server busy never reach it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.core.requestbounds import ROLES
from llmgw.testing.cluster import Cluster

pytestmark = pytest.mark.e2e

CHAT = "smol"
EMBED = "smol-embed"


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory, engine_cache: Path, model_file: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("checks"), engine_cache) as running:
        running.start_server()
        running.add_model(CHAT, model_file, {"ctx_size": 2048, "parallel": 2})
        running.add_model(
            EMBED,
            model_file,
            {
                "ctx_size": 512,
                "parallel": 1,
                "serves": "embeddings",
                "pooling": "mean",
                "args": ["--ubatch-size", "64", "--batch-size", "64"],
            },
        )
        running.create_key()
        running.start_agent("node1")
        running.wait_ready(CHAT, 180)
        running.wait_ready(EMBED, 180)
        yield running


@pytest.fixture(scope="module")
def http(smol: Cluster) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {smol.key}"}
    with httpx.Client(base_url=f"{smol.url}/v1", headers=headers, timeout=120) as client:
        yield client


# -- the shapes of the fields, each valid or broken ------------------------------------------------

SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
)
JSON = st.recursive(
    SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=5,
)
"""Any JSON value: what a broken field may be."""


def field(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(valid, valid, valid, valid, JSON)


FEW_TOKENS = st.one_of(
    st.integers(1, 4),
    st.integers(1, 4),
    st.sampled_from([-1, 0, 2.5, 3.0, "4", True, [], {}, 10**9, 2**70, 1e308]),
)
"""How many tokens to generate: a few (each example stays short; null or none asks for the whole
context), or a broken number."""


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
PART = st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}) | JSON
ROLE = st.sampled_from(sorted(ROLES)) | st.just("user")
MESSAGE = st.fixed_dictionaries({"role": field(ROLE), "content": field(TEXT | st.lists(PART, max_size=2))})
TOOL = st.fixed_dictionaries(
    {
        "type": field(st.just("function")),
        "function": field(
            st.fixed_dictionaries(
                {"name": field(st.sampled_from(["add", "look_up"]))},
                optional={"parameters": field(st.just({"type": "object", "properties": {}}))},
            )
        ),
    }
)
SAMPLING = {
    "temperature": field(st.floats(0, 2)),
    "top_p": field(st.floats(0, 1)),
    "presence_penalty": field(st.floats(-2, 2)),
    "frequency_penalty": field(st.floats(-2, 2)),
    "seed": field(st.integers(-1, 2**31)),
    "stop": field(TEXT | st.lists(TEXT, max_size=3)),
    "logit_bias": field(st.dictionaries(st.integers(0, 49151).map(str), st.floats(-100, 100), max_size=4)),
    "stream": field(st.booleans()),
    "user": field(TEXT),
    "n": field(st.integers(1, 3)),
}
CHAT_BODY = st.fixed_dictionaries(
    {
        "model": st.just(CHAT),
        "messages": field(st.lists(MESSAGE, min_size=1, max_size=3)),
        "max_tokens": FEW_TOKENS,
    },
    optional={
        **SAMPLING,
        "logprobs": field(st.booleans()),
        "top_logprobs": field(st.integers(0, 5)),
        "tools": field(st.lists(TOOL, max_size=2)),
        "tool_choice": field(st.sampled_from(["none", "auto", "required"])),
        "response_format": field(st.sampled_from([{"type": "text"}, {"type": "json_object"}])),
    },
)
PROMPT = (
    TEXT | st.lists(TEXT, min_size=1, max_size=2) | st.lists(st.integers(0, 49151), min_size=1, max_size=4)
)
COMPLETION_BODY = st.fixed_dictionaries(
    {"model": st.just(CHAT), "prompt": field(PROMPT), "max_tokens": FEW_TOKENS},
    optional={**SAMPLING, "logprobs": field(st.integers(0, 5)), "echo": field(st.booleans())},
)
WORDS = TEXT.filter(bool)
EMBEDDINGS_BODY = st.fixed_dictionaries(
    {"model": st.just(EMBED), "input": field(WORDS | st.lists(WORDS, min_size=1, max_size=3))},
    optional={"encoding_format": field(st.sampled_from(["float", "base64"])), "user": field(TEXT)},
)
RESPONSES_BODY = st.fixed_dictionaries(
    {
        "model": st.just(CHAT),
        "input": field(TEXT.filter(bool) | st.lists(MESSAGE, min_size=1, max_size=2)),
        "max_output_tokens": FEW_TOKENS,
    },
    optional={
        "instructions": field(TEXT),
        "temperature": SAMPLING["temperature"],
        "stream": SAMPLING["stream"],
        "store": field(st.booleans()),
    },
)
REQUESTS = st.one_of(
    st.tuples(st.just("/chat/completions"), CHAT_BODY),
    st.tuples(st.just("/completions"), COMPLETION_BODY),
    st.tuples(st.just("/embeddings"), EMBEDDINGS_BODY),
    st.tuples(st.just("/responses"), RESPONSES_BODY),
)


@pytest.mark.timeout(600)
@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(request=REQUESTS)
def test_every_body_is_answered_2xx_or_4xx_never_5xx(http: httpx.Client, request: tuple[str, Any]) -> None:
    path, body = request
    response = http.post(path, json=body)
    assert response.status_code < 300 or 400 <= response.status_code < 500, (path, body, response.text)
    if response.status_code >= 400:
        error = response.json()["error"]
        assert "json.exception" not in error["message"], error


def test_a_million_entry_logit_bias_is_refused_at_once(http: httpx.Client) -> None:
    body = {
        "model": CHAT,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "logit_bias": {str(token): 1 for token in range(1_000_000)},
    }
    started = time.monotonic()
    response = http.post("/chat/completions", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "logit_bias"
    assert time.monotonic() - started < 10, "refused without the engine (which takes hours)"


def test_an_embeddings_input_longer_than_the_engines_batch_is_400(http: httpx.Client) -> None:
    response = http.post("/embeddings", json={"model": EMBED, "input": "word " * 200})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "input_too_long" and "--ubatch-size" in error["message"]
