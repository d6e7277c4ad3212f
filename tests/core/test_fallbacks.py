"""A model's fallbacks: the fields of its definition, and their check against the catalog."""

from __future__ import annotations

import pytest

from llmgw.core.catalog import parse_model
from llmgw.core.fallbacks import Target, fallback_problems, falling_to
from llmgw.errors import ValidationFailed

SOURCE = {"sha256": "a" * 64}


def test_a_definition_names_its_fallbacks_in_order_with_a_first_token_limit() -> None:
    model = parse_model(
        {"name": "big", "source": SOURCE, "fallbacks": ["mid", "small"], "fallback_ttft_ms": 800}
    )
    assert model.fallbacks == ("mid", "small")
    assert model.fallback_ttft_ms == 800


def test_a_definition_without_fallbacks_falls_nowhere() -> None:
    model = parse_model({"name": "big", "source": SOURCE})
    assert model.fallbacks == ()
    assert model.fallback_ttft_ms is None


@pytest.mark.parametrize(
    ("given", "field", "words"),
    [
        ({"fallbacks": ["small", "small"]}, "fallbacks", "more than once"),
        ({"fallbacks": ["no spaces"]}, "fallbacks", "not a model name"),
        ({"fallback_ttft_ms": 500}, "fallback_ttft_ms", "needs fallbacks"),
        ({"fallbacks": ["small"], "fallback_ttft_ms": 0}, "fallback_ttft_ms", "greater than 0"),
        ({"fallbacks": [f"m{n}" for n in range(9)]}, "fallbacks", "at most 8"),
    ],
)
def test_a_wrong_fallback_field_is_named_with_what_is_wrong(
    given: dict[str, object], field: str, words: str
) -> None:
    with pytest.raises(ValidationFailed) as refused:
        parse_model({"name": "big", "source": SOURCE, **given})
    assert [(f, why) for f, why in refused.value.problems if f == field and words in why], (
        refused.value.problems
    )


def test_fallbacks_that_exist_and_serve_the_same_routes_pass() -> None:
    catalog = {"mid": Target(("small",)), "small": Target()}
    assert fallback_problems("big", Target(("mid", "small")), catalog) == []


def test_a_fallback_missing_from_the_catalog_is_named_by_its_place() -> None:
    problems = fallback_problems("big", Target(("small", "gone")), {"small": Target()})
    assert problems == [("fallbacks.1", "no model 'gone' in the catalog; add it first or remove it here")]


def test_a_model_falling_to_itself_is_refused() -> None:
    [(field, why)] = fallback_problems("big", Target(("big",)), {})
    assert field == "fallbacks.0"
    assert "itself" in why


def test_a_fallback_serving_other_routes_is_refused() -> None:
    [(field, why)] = fallback_problems("big", Target(("embed",)), {"embed": Target(serves="embeddings")})
    assert field == "fallbacks.0"
    assert "serves embeddings" in why


def test_a_circle_through_other_models_is_refused_and_shown() -> None:
    catalog = {"mid": Target(("small",)), "small": Target(("other", "big")), "other": Target()}
    [(field, why)] = fallback_problems("big", Target(("mid",)), catalog)
    assert field == "fallbacks.0"
    assert "big -> mid -> small -> big" in why


def test_the_models_falling_to_a_model_are_found() -> None:
    catalog = {"a": Target(("c",)), "b": Target(("d", "c")), "c": Target(), "d": Target()}
    assert falling_to("c", catalog) == ["a", "b"]
    assert falling_to("a", catalog) == []
