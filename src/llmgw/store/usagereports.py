"""Reading usage: rows summed in the database over hour, day or month buckets and chosen groups.

A report sums the usage rows (:mod:`llmgw.store.usage`) with one ``GROUP BY``
over a time bucket and any of key, project, team, organization and model, in
the database: a month of rows never crosses the wire. Buckets are in UTC and
come back as text of one shape from either database, which differ in their
date functions: SQLite's ``strftime``, PostgreSQL's ``date_trunc`` (on the
time in UTC) under ``to_char``. A row counts in the bucket of its ``at`` (when
the writer flushed it, every few seconds).

What a reader may see is a :class:`UsageScope` (organizations, teams and
places whose rows it reads; None: all). A report holds at most ``limit``
groups, the earliest buckets first, and says when more were left out.

Requests refused before any replica took them count in their group's
requests and errors, and by the status they were refused with
(:attr:`UsageGroup.refused`), summed by a second ``GROUP BY`` over the rows
of refusals (``refused`` not 0) of the buckets the report holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, case, false, func, or_, select

from llmgw.store.tables import UsageRow

if TYPE_CHECKING:
    from llmgw.store.access import StoreAccess


class Bucket(StrEnum):
    """How long a report's time buckets are (UTC)."""

    HOUR = "hour"
    DAY = "day"
    MONTH = "month"


class Dimension(StrEnum):
    """What usage can be grouped by."""

    KEY = "key"
    PROJECT = "project"
    """The key's place: its project (a user's own key: the user; a key of no place: empty)."""
    TEAM = "team"
    ORG = "org"
    MODEL = "model"


COLUMNS = {
    Dimension.KEY: UsageRow.key_id,
    Dimension.PROJECT: UsageRow.place,
    Dimension.TEAM: UsageRow.team,
    Dimension.ORG: UsageRow.org,
    Dimension.MODEL: UsageRow.model,
}

_SQLITE_FORMATS = {
    Bucket.HOUR: "%Y-%m-%dT%H:00:00",
    Bucket.DAY: "%Y-%m-%dT00:00:00",
    Bucket.MONTH: "%Y-%m-01T00:00:00",
}
_POSTGRES_FORMAT = 'YYYY-MM-DD"T"HH24:MI:SS'


def bucket_start(dialect: str, bucket: Bucket) -> ColumnElement[str]:
    """The start of the row's ``bucket`` as ``YYYY-MM-DDTHH:MM:SS`` (UTC), in ``dialect``'s functions."""
    if dialect == "postgresql":
        return func.to_char(
            func.date_trunc(bucket.value, func.timezone("UTC", UsageRow.at)), _POSTGRES_FORMAT
        )
    if dialect == "sqlite":  # the store keeps SQLite's timestamps in UTC, as text
        return func.strftime(_SQLITE_FORMATS[bucket], UsageRow.at)
    raise ValueError(f"usage reports know SQLite and PostgreSQL, not {dialect}")


@dataclass(frozen=True, slots=True)
class UsageScope:
    """The usage a reader may see: rows of these organizations, teams or places (``org:…``, ...)."""

    orgs: frozenset[str] = frozenset()
    teams: frozenset[str] = frozenset()
    places: frozenset[str] = frozenset()

    def condition(self) -> ColumnElement[bool]:
        parts = [
            column.in_(sorted(values))
            for column, values in (
                (UsageRow.org, self.orgs),
                (UsageRow.team, self.teams),
                (UsageRow.place, self.places),
            )
            if values
        ]
        return or_(*parts) if parts else false()


@dataclass(frozen=True, slots=True)
class UsageQuery:
    """What a report sums: over which buckets and groups, between which times, seen by whom."""

    bucket: Bucket = Bucket.DAY
    group_by: tuple[Dimension, ...] = (Dimension.MODEL,)
    since: datetime | None = None
    """Rows written at or after this (None: from the first)."""
    until: datetime | None = None
    """Rows written before this (None: to the last)."""
    scope: UsageScope | None = None
    """None: every row."""
    limit: int = 1000
    """The most groups a report holds."""


@dataclass(frozen=True, slots=True)
class UsageGroup:
    """The usage of one group in one bucket; a dimension not grouped by is None."""

    start: datetime
    """When the bucket starts (UTC)."""
    key_id: str | None
    project: str | None
    team: str | None
    org: str | None
    model: str | None
    requests: int
    failed: int
    prompt_tokens: int
    completion_tokens: int
    streamed: int
    ttft_ms: int
    generation_ms: int
    timed_tokens: int = 0
    """Completion tokens of rows whose generation was timed (rows written before timings were kept
    have tokens and no time)."""
    refused: dict[int, int] = field(default_factory=dict)
    """Requests refused before any replica took them, by the status they were refused with."""
    cached_tokens: int = 0
    """Prompt tokens the engines found in their caches (of ``prompt_tokens``)."""
    cost: float = 0.0
    """What the requests cost, each at the price in force when it ended (the cluster's currency)."""

    @property
    def ttft_mean_ms(self) -> float | None:
        """Mean time to first token of the streamed requests (None: none streamed)."""
        return self.ttft_ms / self.streamed if self.streamed else None

    @property
    def tokens_per_s(self) -> float | None:
        """Completion tokens per second of generating them (None: no time measured)."""
        return self.timed_tokens * 1000 / self.generation_ms if self.generation_ms else None


@dataclass(frozen=True, slots=True)
class UsageReport:
    groups: list[UsageGroup]
    truncated: bool
    """More groups matched than the query's limit; the latest were left out."""


SUMS = (
    UsageRow.requests,
    UsageRow.failed,
    UsageRow.prompt_tokens,
    UsageRow.completion_tokens,
    UsageRow.streamed,
    UsageRow.ttft_ms,
    UsageRow.generation_ms,
    case((UsageRow.generation_ms > 0, UsageRow.completion_tokens), else_=0),
    UsageRow.cached_tokens,
    UsageRow.cost,
)


class UsageReports:
    """Sums of usage over time buckets and groups, computed by the database."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store

    async def report(self, query: UsageQuery) -> UsageReport:
        """The groups of ``query``, by bucket then by the grouped dimensions; at most ``query.limit``."""
        bucket = bucket_start(self._store.engine.dialect.name, query.bucket)
        start = bucket.label("bucket")
        dimensions = list(dict.fromkeys(query.group_by))
        grouped = [COLUMNS[d] for d in dimensions]
        conditions = []
        if query.since is not None:
            conditions.append(UsageRow.at >= query.since)
        if query.until is not None:
            conditions.append(UsageRow.at < query.until)
        if query.scope is not None:
            conditions.append(query.scope.condition())
        statement = select(start, *grouped, *(func.sum(c) for c in SUMS)).group_by(start, *grouped)
        statement = statement.where(*conditions).order_by(start, *grouped).limit(query.limit + 1)
        async with self._store.session() as session:
            rows = (await session.execute(statement)).all()
            groups = [_group(row, dimensions) for row in rows[: query.limit]]
            if groups:
                refusals = (
                    select(start, *grouped, UsageRow.refused, func.sum(UsageRow.requests))
                    .where(*conditions, UsageRow.refused != 0, bucket <= _text(groups[-1].start))
                    .group_by(start, *grouped, UsageRow.refused)
                )
                by_group = {(g.start, *_values(g, dimensions)): g.refused for g in groups}
                for row in await session.execute(refusals):
                    *named, status, requests = row
                    counts = by_group.get((_time(named[0]), *named[1:]))
                    if counts is not None:
                        counts[int(status)] = int(requests or 0)
        return UsageReport(groups, truncated=len(rows) > query.limit)


def _time(text: str) -> datetime:
    """A bucket's start as the database gave it: ``YYYY-MM-DDTHH:MM:SS``, in UTC."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def _text(start: datetime) -> str:
    """A bucket's start as the database writes it (compared as text: same shape in either)."""
    return start.strftime("%Y-%m-%dT%H:%M:%S")


def _values(group: UsageGroup, dimensions: list[Dimension]) -> list[str | None]:
    named = {
        Dimension.KEY: group.key_id,
        Dimension.PROJECT: group.project,
        Dimension.TEAM: group.team,
        Dimension.ORG: group.org,
        Dimension.MODEL: group.model,
    }
    return [named[d] for d in dimensions]


def _group(row: Sequence[Any], dimensions: list[Dimension]) -> UsageGroup:
    values: dict[Dimension, str] = dict(zip(dimensions, row[1 : 1 + len(dimensions)], strict=True))
    *counts, cost = row[1 + len(dimensions) :]
    requests, failed, prompt, completion, streamed, ttft, generation, timed, cached = (
        int(v or 0) for v in counts
    )
    return UsageGroup(
        start=_time(row[0]),
        key_id=values.get(Dimension.KEY),
        project=values.get(Dimension.PROJECT),
        team=values.get(Dimension.TEAM),
        org=values.get(Dimension.ORG),
        model=values.get(Dimension.MODEL),
        requests=requests,
        failed=failed,
        prompt_tokens=prompt,
        completion_tokens=completion,
        streamed=streamed,
        ttft_ms=ttft,
        generation_ms=generation,
        timed_tokens=timed,
        cached_tokens=cached,
        cost=float(cost or 0.0),
    )
