"""The admin API's shapes for usage: what ``/api/usage`` answers, one line per bucket and group."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from llmgw.adminapi.schemas import AnswerModel

BucketName = Literal["hour", "day", "month"]
"""How long each bucket of a usage answer is (UTC)."""
DimensionName = Literal["key", "project", "team", "org", "model"]
"""What usage can be grouped by; ``project`` is the key's place (a user's own key: ``user:NAME``)."""

MAX_LIMIT = 10_000
"""The most lines one usage answer holds."""

CSV_COLUMNS = (
    "start",
    "key",
    "key_name",
    "project",
    "team",
    "org",
    "model",
    "requests",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "cost",
    "refused",
    "ttft_mean_ms",
    "tokens_per_s",
)
"""The columns of a usage answer in CSV (those of dimensions not grouped by are left out)."""


class UsageLine(AnswerModel):
    """The usage of one group in one time bucket; a dimension not grouped by is null."""

    start: datetime
    """When the bucket starts (UTC)."""
    key: str | None = None
    """The key's id."""
    key_name: str | None = None
    """The key's name (null: the key is no longer known)."""
    project: str | None = None
    """Where the key sat when it was used: ``project:ORG/TEAM/PROJECT``, ``user:NAME``, or empty
    (a key of no place)."""
    team: str | None = None
    """``team:ORG/TEAM`` of that project (empty for a user's key)."""
    org: str | None = None
    """``org:ORG`` of that project (empty for a user's key)."""
    model: str | None = None
    requests: int
    """Every request the key made: those replicas answered and those refused before any did."""
    errors: int
    """Requests answered with an error, or that the client left (status 400 and above), refused ones
    included."""
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    """Prompt tokens the engine found in its cache (of ``prompt_tokens``), where the engine says:
    OpenAI's ``usage.prompt_tokens_details.cached_tokens``, llama.cpp's ``timings.cache_n``; else 0."""
    cost: float = 0.0
    """What the requests cost, in ``currency``: each request at its model's price when it ended
    (``pricing.models.<model>``); 0 for a model without a price."""
    refused: dict[str, int] = Field(default_factory=dict)
    """Requests refused before any replica took them, by the HTTP status they were answered with
    (``{"429": 3, "400": 1}``: limits, bad bodies, unknown models, no replica ready …); they count in
    ``requests`` and ``errors`` and used no tokens. In CSV: ``429:3 400:1``."""
    ttft_mean_ms: float | None = None
    """Mean time to first token of the streamed requests, in milliseconds (null: none streamed). A
    mean, because rows hold sums over each few seconds: exact to sum again over any bucket and group,
    where a median would need every request kept."""
    tokens_per_s: float | None = None
    """Completion tokens per second of generating them (null: no tokens made)."""


class UsageTotals(AnswerModel):
    """The lines of an answer summed."""

    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost: float = 0.0


class UsageAnswer(AnswerModel):
    """Usage summed per time bucket and group, earliest bucket first."""

    by: BucketName
    group_by: list[DimensionName]
    since: datetime | None = Field(default=None, alias="from")
    """Usage written at or after this (null: from the first)."""
    until: datetime | None = Field(default=None, alias="to")
    """Usage written before this (null: to now)."""
    lines: list[UsageLine]
    currency: str = "USD"
    """The currency of every ``cost`` (the setting ``pricing.currency``)."""
    totals: UsageTotals = Field(default_factory=UsageTotals)
    """The lines summed (of a truncated answer: of the lines it holds)."""
    limit: int
    truncated: bool
    """More lines matched than ``limit``: the latest were left out."""
    note: str = ""
    """What to do about a truncated answer (empty otherwise)."""
