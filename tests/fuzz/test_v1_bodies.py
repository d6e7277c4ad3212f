"""Generated /v1 bodies: whatever a client sends, the gateway never answers 5xx of its own.

Every refusal is a 4xx in OpenAI's error shape. Bodies mix valid requests with
what breaks parsers: lone surrogates, deep nesting, huge and non-finite
numbers, wrong types, unknown fields, huge strings and invalid UTF-8.
``LLMGW_FUZZ_EXAMPLES`` sets how many each test runs (``make fuzz`` runs many).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .v1_server import MODEL, SECRET, v1_server

EXAMPLES = int(os.environ.get("LLMGW_FUZZ_EXAMPLES", "150"))
PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]
SEEN = {"requests": 0, "5xx": 0}

fuzz = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with v1_server() as url, httpx.Client(base_url=url, timeout=30) as http:
        yield http
    print(f"\n/v1 fuzzing: {SEEN['requests']} requests, {SEEN['5xx']} answered 5xx")


texts = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["\ud800", "a\udfffb", "\x00", "\u202e", "💥" * 3]),
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=4),
    st.just("x" * 200_000),
)
numbers = st.one_of(
    st.integers(),
    st.just(10**400),
    st.floats(allow_nan=True, allow_infinity=True),
)
leaves = st.one_of(st.none(), st.booleans(), numbers, texts)
values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool"]), "content": values}
    ),
    max_size=3,
)
requests = st.fixed_dictionaries(
    {"model": st.one_of(st.just(MODEL), values)},
    optional={
        "messages": st.one_of(messages, values),
        "prompt": values,
        "input": values,
        "stream": st.one_of(st.booleans(), values),
        "stream_options": st.one_of(st.just({}), st.just({"include_usage": True}), values),
        "max_tokens": values,
        "lora": values,
        "unknown_field": values,
    },
)


def encoded(body: dict[str, Any]) -> bytes:
    """JSON as a client library might write it: surrogates escaped, and numbers Python's json allows."""
    return json.dumps(body).encode()


def deep(depth: int, opener: str) -> bytes:
    closer = "]" if opener == "[" else "}"
    inner = '{"a":' if opener == "{" else "["
    return ('{"model":"' + MODEL + '","messages":' + inner * depth + "1" + closer * depth + "}").encode()


def check(response: httpx.Response) -> None:
    SEEN["requests"] += 1
    if response.status_code >= 500:
        SEEN["5xx"] += 1
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["message"] and error["type"] and error["code"], error


@fuzz
@given(body=requests, path=st.sampled_from(PATHS))
def test_generated_bodies_never_get_a_5xx(client: httpx.Client, body: dict[str, Any], path: str) -> None:
    response = client.post(path, content=encoded(body), headers={"Authorization": f"Bearer {SECRET}"})
    check(response)


@fuzz
@given(raw=st.binary(max_size=300), path=st.sampled_from(PATHS))
def test_arbitrary_bytes_never_get_a_5xx(client: httpx.Client, raw: bytes, path: str) -> None:
    check(client.post(path, content=raw, headers={"Authorization": f"Bearer {SECRET}"}))


@pytest.mark.parametrize("opener", ["[", "{"])
@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_deeply_nested_bodies_are_refused_with_400(client: httpx.Client, opener: str, depth: int) -> None:
    response = client.post(
        "/v1/chat/completions", content=deep(depth, opener), headers={"Authorization": f"Bearer {SECRET}"}
    )
    check(response)


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"fuzz-chat","stream":true,"stream_options":{},"messages":[{"role":"user","content":"\\ud800"}]}',
        b'{"model":"fuzz-chat","stream":true,"messages":[{"role":"user","content":"\\udfff"}]}',
        b'{"model":"fuzz-chat","messages":[{"role":"user","content":"a\\ud800b"}],"lora":"x"}',
        b'{"model":"fuzz-chat","max_tokens":1e999,"messages":[]}',
        b'{"model":"fuzz-chat","max_tokens":NaN,"messages":[]}',
        b'{"model":"fuzz-chat\xff\xfe","messages":[]}',
        b'{"model":"\xed\xa0\x80"}',
    ],
)
def test_known_breakers_never_get_a_5xx(client: httpx.Client, body: bytes) -> None:
    for stream in (False, True):
        check(
            client.post(
                "/v1/chat/completions",
                content=body if not stream else body.replace(b'"model"', b'"stream":true,"model"', 1),
                headers={"Authorization": f"Bearer {SECRET}"},
            )
        )
