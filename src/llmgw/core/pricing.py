"""What models cost: prices per million tokens (or per picture), and the cost of a request.

A model's price is a setting, ``pricing.models.<model>``, holding a JSON
object of :class:`Price`'s fields::

    {"input": 0.5, "cached_input": 0.05, "output": 1.5}     # per million tokens
    {"picture": 0.02}                                         # an image model (ComfyUI)

and ``pricing.currency`` names the currency every price is in (default
``USD``). Settings keep their history, so every price a model had, and when,
stays on record (``llmgw ctl config history``).

The gateway holds the prices in memory (:class:`Prices`) and works out each
request's cost when it ends, from the tokens its engine counted; the cost is
stored on the usage row with the tokens. A price change therefore applies
from the moment it reaches the gateway, and usage counted before keeps the
price it was counted at: reports sum costs in the database without joining a
price history by time.

Money is counted in budgets as whole *nanos* (10⁻⁹ of the currency,
:func:`nanos`): integers add up exactly across processes and in the store's
counts as tokens do; a billion of them is one dollar.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

PRICE_PREFIX = "pricing.models."
"""A model's price is the setting ``pricing.models.<model>``."""
CURRENCY_SETTING = "pricing.currency"
"""The currency every price is in (ISO 4217, ``USD`` when not set)."""
DEFAULT_CURRENCY = "USD"
NANOS = 1_000_000_000
"""Nanos in one unit of the currency."""
PER = 1_000_000
"""Token prices are per this many tokens."""


@dataclass(frozen=True, slots=True)
class Price:
    """What one model costs; a price not given is 0 (``cached_input``: the ``input`` price)."""

    input: float = 0.0
    """Per million prompt tokens."""
    cached_input: float | None = None
    """Per million prompt tokens the engine found in its cache (None: as ``input``)."""
    output: float = 0.0
    """Per million completion tokens."""
    picture: float = 0.0
    """Per picture made (image models)."""

    def cost(self, prompt: int, completion: int, cached: int = 0, pictures: int = 0) -> float:
        """The cost of ``prompt`` tokens (``cached`` of them from the engine's cache), ``completion``
        tokens and ``pictures``, in the currency."""
        cached = min(max(0, cached), prompt)
        cached_price = self.input if self.cached_input is None else self.cached_input
        tokens = (prompt - cached) * self.input + cached * cached_price + completion * self.output
        return tokens / PER + pictures * self.picture

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_value(cls, value: Any) -> Price:
        """A price from its setting's JSON value; ValueError saying what is wrong."""
        if not isinstance(value, Mapping):
            raise ValueError('a price is a JSON object of per-million prices: {"input": 0.5, "output": 1.5}')
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"a price has no field {', '.join(unknown)}; its fields are {', '.join(known)}")
        if not value:
            raise ValueError(f"a price names at least one of {', '.join(known)}")
        for name, amount in value.items():
            if isinstance(amount, bool) or not isinstance(amount, int | float) or not math.isfinite(amount):
                raise ValueError(
                    f"{name} is a number (a price per million tokens or per picture), not {amount!r}"
                )
            if amount < 0:
                raise ValueError(f"{name} must be 0 or more, not {amount}")
        return cls(**{name: float(amount) for name, amount in value.items()})


def price_key(model: str) -> str:
    """The setting that holds ``model``'s price."""
    return PRICE_PREFIX + model


def priced_model(key: str) -> str | None:
    """The model a price setting's key names (None: ``key`` is no price setting)."""
    if key.startswith(PRICE_PREFIX) and len(key) > len(PRICE_PREFIX):
        return key[len(PRICE_PREFIX) :]
    return None


def currency_problem(value: Any) -> str:
    """Why ``value`` is no currency (empty: it is one): three capital letters, ISO 4217."""
    if isinstance(value, str) and len(value) == 3 and value.isascii() and value.isalpha() and value.isupper():
        return ""
    return f'{CURRENCY_SETTING} takes a JSON string of three capital letters (ISO 4217: "USD", "EUR")'


def price_problem(key: str, value: Any) -> str:
    """Why ``value`` is no price for the setting ``key`` (empty: it is one)."""
    try:
        Price.from_value(value)
    except ValueError as error:
        return f"{key}: {error}"
    return ""


def nanos(cost: float) -> int:
    """``cost`` as whole nanos of the currency (how budgets count money)."""
    return round(cost * NANOS)


def money(amount_nanos: float) -> float:
    """Nanos back as the currency."""
    return amount_nanos / NANOS


@dataclass(frozen=True)
class Prices:
    """Every model's price and the currency; a model with no price costs nothing."""

    models: Mapping[str, Price] = field(default_factory=dict)
    currency: str = DEFAULT_CURRENCY

    def of(self, model: str) -> Price | None:
        return self.models.get(model)

    def cost(self, model: str, prompt: int, completion: int, cached: int = 0, pictures: int = 0) -> float:
        """What a request for ``model`` cost (0 when the model has no price)."""
        price = self.models.get(model)
        return 0.0 if price is None else price.cost(prompt, completion, cached, pictures)

    def as_dict(self) -> dict[str, Any]:
        return {"currency": self.currency, "models": {m: p.as_dict() for m, p in self.models.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Prices:
        models = {str(m): Price.from_value(v) for m, v in dict(data.get("models", {})).items()}
        return cls(models, str(data.get("currency", DEFAULT_CURRENCY)))

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> Prices:
        """The prices the settings hold; a value that is no price (set before it was checked) is left
        out rather than failing every other."""
        models: dict[str, Price] = {}
        for key, value in settings.items():
            model = priced_model(key)
            if model is None:
                continue
            try:
                models[model] = Price.from_value(value)
            except ValueError:
                continue
        currency = settings.get(CURRENCY_SETTING, DEFAULT_CURRENCY)
        return cls(models, currency if not currency_problem(currency) else DEFAULT_CURRENCY)
