"""A provider model: served outside the cluster, with no weights, profiles or replicas to place."""

from __future__ import annotations

import pytest

from llmgw.core.catalog import parse_model
from llmgw.core.providers import KEY_SET, ProviderApi, served_outside, shown_definition, shown_key
from llmgw.errors import ValidationFailed

SHA = "a" * 64


def provider_model(**provider: object) -> dict[str, object]:
    return {
        "name": "gpt",
        "provider": {"base_url": "https://api.example.com/v1", "model": "gpt-4o", **provider},
    }


def test_a_provider_model_needs_no_source_and_is_never_placed() -> None:
    model = parse_model(provider_model(key="sk-secret"))
    assert model.source is None
    assert model.provider is not None and model.provider.api is ProviderApi.OPENAI
    assert model.wanted_replicas(demanded=True) == 0
    assert model.memory_needed_mb() > 0  # the default profile's runtime only: nothing to fetch


def test_a_provider_model_reads_back_from_its_own_dump() -> None:
    model = parse_model(provider_model(key="sk-secret", max_concurrency=3))
    again = parse_model(model.model_dump(mode="json"))
    assert again == model


def test_a_model_without_provider_still_needs_its_source() -> None:
    with pytest.raises(ValidationFailed) as raised:
        parse_model({"name": "m"})
    assert raised.value.problems == [("source", "required")]


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"source": {"sha256": SHA}}, "source"),
        ({"profile": {"ctx_size": 8192}}, "profiles"),
        ({"replicas": {"min": 2, "max": 2}}, "replicas"),
        ({"on_demand": True}, "on_demand"),
    ],
)
def test_a_provider_model_refuses_what_only_a_placed_model_has(extra: dict[str, object], named: str) -> None:
    with pytest.raises(ValidationFailed) as raised:
        parse_model({**provider_model(), **extra})
    text = str(raised.value.problems)
    assert "not placed on the cluster" in text and named in text


@pytest.mark.parametrize(
    ("base_url", "why"),
    [
        ("ftp://example.com", "http:// or https://"),
        ("https://", "http:// or https://"),
        ("https://user:pw@example.com/v1", "credentials"),
        ("https://example.com:99999/v1", "port"),
    ],
)
def test_a_bad_base_url_is_refused_saying_why(base_url: str, why: str) -> None:
    with pytest.raises(ValidationFailed) as raised:
        parse_model(provider_model(base_url=base_url))
    assert why in dict(raised.value.problems)["provider.base_url"]


def test_the_root_and_path_prefix_come_from_the_sdk_style_base_url() -> None:
    openai = parse_model(provider_model(base_url="https://api.example.com/openai/v1/")).provider
    assert openai is not None
    assert (openai.root, openai.path_prefix, openai.secure) == (
        "https://api.example.com:443",
        "/openai",
        True,
    )
    anthropic = parse_model(provider_model(api="anthropic", base_url="http://127.0.0.1:8081")).provider
    assert anthropic is not None
    assert (anthropic.root, anthropic.path_prefix, anthropic.secure) == ("http://127.0.0.1:8081", "", False)


def test_the_key_is_shown_as_set_never_itself() -> None:
    model = parse_model(provider_model(key="sk-secret"))
    assert model.provider is not None
    assert "sk-secret" not in repr(model)
    assert shown_key(model.provider).key == KEY_SET
    shown = shown_definition(model.model_dump(mode="json"))
    assert shown["provider"]["key"] == KEY_SET and "sk-secret" not in str(shown)
    keyless = parse_model(provider_model()).provider
    assert keyless is not None and shown_key(keyless).key == ""


def test_a_key_of_more_than_one_line_is_refused() -> None:
    with pytest.raises(ValidationFailed) as raised:
        parse_model(provider_model(key="sk\nX-Injected: 1"))
    assert raised.value.problems[0][0] == "provider.key"


def test_served_outside_names_api_model_and_host() -> None:
    assert served_outside(parse_model(provider_model())) == "openai gpt-4o at api.example.com"
    assert served_outside(parse_model({"name": "m", "source": {"sha256": SHA}})) == ""
