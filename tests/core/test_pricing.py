"""Prices per million tokens and per picture, their settings, and what a request costs."""

from __future__ import annotations

import pytest

from llmgw.core.pricing import (
    CURRENCY_SETTING,
    Price,
    Prices,
    currency_problem,
    money,
    nanos,
    price_key,
    priced_model,
)
from llmgw.core.settingtypes import key_problem, value_problem


def test_a_request_costs_its_prompt_and_completion_at_their_prices_per_million() -> None:
    price = Price(input=2.0, output=6.0)
    assert price.cost(prompt=1_000, completion=500) == pytest.approx(0.002 + 0.003)


def test_cached_prompt_tokens_cost_the_cached_price_and_the_rest_the_input_price() -> None:
    price = Price(input=1.0, cached_input=0.1, output=0.0)
    assert price.cost(prompt=1_000_000, completion=0, cached=400_000) == pytest.approx(0.6 + 0.04)


def test_cached_tokens_without_a_cached_price_cost_the_input_price() -> None:
    assert Price(input=1.0).cost(1_000_000, 0, cached=500_000) == pytest.approx(1.0)


def test_more_cached_tokens_than_prompt_tokens_count_as_the_prompt() -> None:
    price = Price(input=1.0, cached_input=0.0)
    assert price.cost(100, 0, cached=1_000) == 0.0
    assert price.cost(100, 0, cached=-5) == pytest.approx(100 / 1_000_000)


def test_pictures_cost_their_price_each() -> None:
    assert Price(picture=0.02).cost(0, 0, pictures=3) == pytest.approx(0.06)


def test_a_model_without_a_price_costs_nothing() -> None:
    prices = Prices({"smol": Price(input=1.0)})
    assert prices.cost("other", 1_000, 1_000) == 0.0
    assert prices.cost("smol", 1_000_000, 0) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({"input": -1}, "input must be 0 or more, not -1"),
        ({"inptu": 1}, "no field inptu"),
        ({}, "at least one of"),
        ({"output": "1.5"}, "output is a number"),
        ({"output": True}, "output is a number"),
        ({"output": float("inf")}, "output is a number"),
        ([1, 2], "a JSON object"),
    ],
)
def test_a_value_that_is_no_price_is_refused_saying_why(value: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Price.from_value(value)
    assert words in value_problem(price_key("smol"), value)


def test_a_price_setting_names_its_model() -> None:
    assert priced_model("pricing.models.org/smol-135m") == "org/smol-135m"
    assert priced_model("pricing.models.") is None
    assert priced_model("serving.stopped") is None


def test_price_settings_and_the_currency_are_settings_llmgw_reads() -> None:
    assert key_problem(price_key("any-model")) == ""
    assert key_problem(CURRENCY_SETTING) == ""
    assert "did you mean pricing.currency" in key_problem("pricing.curency")
    assert value_problem(price_key("m"), {"input": 0.5, "output": 1}) == ""


@pytest.mark.parametrize("value", ["usd", "US", "EURO", 840, None])
def test_a_currency_is_three_capital_letters(value: object) -> None:
    assert "three capital letters" in currency_problem(value)
    assert "three capital letters" in value_problem(CURRENCY_SETTING, value)
    assert currency_problem("EUR") == ""


def test_prices_come_from_the_settings_leaving_out_values_that_are_no_price() -> None:
    prices = Prices.from_settings(
        {
            "pricing.models.a": {"input": 1, "output": 2},
            "pricing.models.b": {"input": -1},
            CURRENCY_SETTING: "EUR",
            "serving.stopped": False,
        }
    )
    assert prices.models == {"a": Price(input=1.0, output=2.0)}
    assert prices.currency == "EUR"
    assert Prices.from_settings({}).currency == "USD"


def test_prices_survive_their_dict_shape() -> None:
    prices = Prices({"a": Price(input=1.0, cached_input=0.5), "img": Price(picture=0.04)}, "EUR")
    assert Prices.from_dict(prices.as_dict()) == prices


def test_money_is_counted_in_whole_nanos() -> None:
    assert nanos(0.000_000_001) == 1
    assert nanos(1.5) == 1_500_000_000
    assert money(nanos(0.123456789)) == pytest.approx(0.123456789)
