"""Fallbacks between models: the other catalog models a request falls to, and how far it may fall.

A model definition names its alternatives in ``fallbacks`` (catalog models, tried in order) and
may set ``fallback_ttft_ms``, the longest wait for its first token before the request falls to
the next one. A request falls when its target has no ready replica, answers 429 or 5xx, or is
slower than that to its first token, and only while nothing of the answer reached the client.

How the target is served (a replica of this cluster, anything else the catalog holds) is not
these rules' concern: a fallback is a name in the catalog.

:class:`FallbackFields` are the fields a :class:`~llmgw.core.catalog.ModelDefinition` takes;
:func:`fallback_problems` checks them against the rest of the catalog (the names exist, serve
what the model serves, and lead back to no model); :class:`FallbackSettings` bound what one
request may try (the retry budget) and when a failing target is skipped (its circuit breaker,
:mod:`llmgw.core.breakers`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

MOST_FALLBACKS = 8
"""Alternatives one model may name."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")


class FallbackFields(BaseModel):
    """A model definition's fallback fields (``ModelDefinition`` takes them from here)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fallbacks: tuple[str, ...] = Field(default=(), max_length=MOST_FALLBACKS)
    """Other catalog models tried in order when this one has no ready replica, answers 429 or 5xx,
    or passes ``fallback_ttft_ms`` before its first token; each must serve what this one serves."""
    fallback_ttft_ms: int | None = Field(default=None, gt=0, le=600_000)
    """Longest wait for the first token (a stream's first event, a whole answer) before the request
    falls to the next of ``fallbacks``; unset: no wait is too long."""

    @field_validator("fallbacks")
    @classmethod
    def _names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not _NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a model name; name catalog models ('llmgw ctl models')")
        twice = sorted({name for name in value if value.count(name) > 1})
        if twice:
            raise ValueError(f"names {', '.join(twice)} more than once; name each fallback once")
        return value

    @field_validator("fallback_ttft_ms")
    @classmethod
    def _ttft_with_fallbacks(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and not info.data.get("fallbacks"):
            raise ValueError("needs fallbacks to fall to; name them in fallbacks, or remove it")
        return value


@dataclass(frozen=True, slots=True)
class Target:
    """A catalog model as the fallback check sees it."""

    fallbacks: tuple[str, ...] = ()
    serves: str = "chat"
    """What its replicas serve (``chat``, ``embeddings``, ``rerank``...): a request falls only to
    a model that answers the same routes."""


def fallback_problems(name: str, model: Target, catalog: Mapping[str, Target]) -> list[tuple[str, str]]:
    """What is wrong with ``model``'s fallbacks (it is called ``name``) in ``catalog``, the other
    models by name: ``(field.path, why)`` pairs, empty when nothing is."""
    problems: list[tuple[str, str]] = []
    for index, target in enumerate(model.fallbacks):
        at = f"fallbacks.{index}"
        other = catalog.get(target)
        if target == name:
            problems.append((at, "is the model itself; name other models"))
        elif other is None:
            problems.append((at, f"no model {target!r} in the catalog; add it first or remove it here"))
        elif other.serves != model.serves:
            why = f"model {target!r} serves {other.serves}, this one {model.serves}: a fallback must "
            problems.append((at, why + "answer the same routes"))
        elif (loop := _path_back(name, target, catalog)) is not None:
            chain = " -> ".join([name, *loop])
            problems.append((at, f"falls back in a circle ({chain}); remove one of these fallbacks"))
    return problems


def _path_back(name: str, start: str, catalog: Mapping[str, Target]) -> list[str] | None:
    """The models from ``start`` through fallbacks back to ``name``, or None when none lead there."""
    seen: set[str] = set()
    trail: list[str] = []

    def walk(at: str) -> bool:
        if at == name:
            return True
        if at in seen:
            return False
        seen.add(at)
        trail.append(at)
        entry = catalog.get(at)
        for following in entry.fallbacks if entry is not None else ():
            if walk(following):
                return True
        trail.pop()
        return False

    if walk(start):
        return [*trail, name]
    return None


def falling_to(name: str, catalog: Mapping[str, Target]) -> list[str]:
    """The models of ``catalog`` naming ``name`` among their fallbacks, sorted."""
    return sorted(other for other, entry in catalog.items() if name in entry.fallbacks and other != name)


class FallbackSettings(BaseModel):
    """What one request may try past its own model, and when a failing target is skipped."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    max_targets: int = Field(default=2, ge=0, le=MOST_FALLBACKS)
    """Further models one request may be sent to after its own (0: none is)."""
    budget_s: float = Field(default=30.0, gt=0)
    """No further model is tried once this many seconds passed since the request arrived."""
    breaker_failures: int = Field(default=5, ge=1)
    """Failures of one model within ``breaker_window_s`` that open its circuit breaker: while open,
    requests that have another model to fall to skip it."""
    breaker_window_s: float = Field(default=30.0, gt=0)
    """The window the failures are counted in."""
    breaker_open_s: float = Field(default=30.0, gt=0)
    """How long an open breaker skips its model; then one request goes through to try it (half
    open): its success closes the breaker, its failure opens it again."""


class RetryBudget:
    """What one request may still try past its own model: a count of targets and a deadline.

    ``clock``: seconds, monotonic; ``started``: when the request arrived on it.
    """

    __slots__ = ("_clock", "_deadline", "left")

    def __init__(self, settings: FallbackSettings, started: float, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._deadline = started + settings.budget_s
        self.left = settings.max_targets
        """Further targets the request may still be sent to."""

    def spent(self) -> str:
        """Why no further target may be tried (``targets``: as many as allowed were; ``time``: the
        budget's seconds passed), or empty while one may."""
        if self.left <= 0:
            return "targets"
        if self._clock() >= self._deadline:
            return "time"
        return ""

    def take(self) -> None:
        """One further target is tried."""
        self.left -= 1
