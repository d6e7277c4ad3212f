"""``/api/usage``: requests, tokens, cost, errors, time to first token and tokens per second, summed
in the database per hour, day or month and per key, project, team, organization or model; JSON or
CSV. ``cost`` is in ``currency`` (the setting ``pricing.currency``); ``totals`` sums the lines.

Every caller sees the usage of what they may read (docs/tenancy.md): a role
at the cluster (viewer and above), everything; a role at an organization or
a team, the usage of keys that sat there; anyone, the usage of their own
keys (``user:NAME``). Usage counts where the key sat when it was used, so it
stays with its project after the key moves or goes.

An answer holds at most ``limit`` lines (:data:`MAX_LIMIT` at most), earliest
buckets first; a cut answer says so (``truncated`` and ``note`` in JSON, the
``X-Llmgw-Truncated`` header in CSV).
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from llmgw.adminapi.usage import (
    CSV_COLUMNS,
    MAX_LIMIT,
    BucketName,
    DimensionName,
    UsageAnswer,
    UsageLine,
    UsageTotals,
)
from llmgw.controlplane.admin.callers import Caller
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import AUTH, State, Who
from llmgw.core.pricing import CURRENCY_SETTING, DEFAULT_CURRENCY
from llmgw.core.tenancy import CLUSTER, Action, Owner, OwnerKind
from llmgw.errors import ValidationFailed
from llmgw.store.usagereports import Bucket, Dimension, UsageGroup, UsageQuery, UsageReports, UsageScope

router = APIRouter(prefix="/api", tags=["usage"], dependencies=AUTH, responses=declared(401, 503))

CSV_TYPE = "text/csv"
TRUNCATED_HEADER = "X-Llmgw-Truncated"

_CSV_ANSWER: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Usage per time bucket and group: JSON, or CSV with format=csv or Accept: text/csv.",
        "content": {CSV_TYPE: {"schema": {"type": "string"}}},
        "headers": {TRUNCATED_HEADER: {"description": "true when lines were left out past the limit"}},
    }
}


def scope_of(caller: Caller) -> UsageScope | None:
    """The usage ``caller`` may read: None (all) with a role at the cluster; else the organizations and
    teams the caller holds a role at, and the caller's own keys."""
    if caller.may(Action.READ, CLUSTER):
        return None
    scopes = {b.scope for b in caller.bindings if caller.may(Action.READ, b.scope)}
    return UsageScope(
        orgs=frozenset(str(s) for s in scopes if s.kind is OwnerKind.ORG),
        teams=frozenset(str(s) for s in scopes if s.kind is OwnerKind.TEAM),
        places=frozenset({str(Owner(OwnerKind.USER, caller.name))}),
    )


def _utc(field: str, value: datetime | None) -> datetime | None:
    """``value`` in UTC (a time without a zone is read as UTC); 400 naming ``field`` when out of range."""
    if value is None:
        return None
    try:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:
        raise ValidationFailed(
            [(field, f"{value.isoformat()} is out of range in UTC")], "give a time between years 1 and 9999"
        ) from None


@router.get(
    "/usage",
    response_model=UsageAnswer,
    responses={**_CSV_ANSWER, **declared(400)},
    response_model_by_alias=True,
)
async def usage(
    request: Request,
    state: State,
    caller: Who,
    group_by: Annotated[list[DimensionName] | None, Query(description="Group by these (repeat it).")] = None,
    by: Annotated[BucketName, Query(description="How long each time bucket is (UTC).")] = "day",
    since: Annotated[datetime | None, Query(alias="from", description="From this time (ISO 8601).")] = None,
    until: Annotated[datetime | None, Query(alias="to", description="Before this time (ISO 8601).")] = None,
    format: Annotated[str | None, Query(pattern="^(json|csv)$", description="json or csv.")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="The most lines answered.")] = 1000,
) -> Any:
    """Usage the caller may read, summed per time bucket and per the groups asked (model by default)."""
    since, until = _utc("from", since), _utc("to", until)
    if since is not None and until is not None and since >= until:
        raise ValidationFailed([("to", "must be later than from")], "give a 'to' later than 'from'")
    dimensions: list[DimensionName] = list(dict.fromkeys(group_by or ["model"]))
    query = UsageQuery(
        bucket=Bucket(by),
        group_by=tuple(Dimension(d) for d in dimensions),
        since=since,
        until=until,
        scope=scope_of(caller),
        limit=limit,
    )
    report = await UsageReports(state.store).report(query)
    names: dict[str, str] = {}
    if "key" in dimensions:
        names = {k.id: k.name for k in await state.store.keys.list(include_revoked=True)}
    lines = [_line(g, names) for g in report.groups]
    answer = UsageAnswer.model_validate(
        {
            "by": by,
            "group_by": dimensions,
            "from": since,
            "to": until,
            "lines": lines,
            "currency": await state.store.settings.get(CURRENCY_SETTING, DEFAULT_CURRENCY),
            "totals": _totals(lines),
            "limit": limit,
            "truncated": report.truncated,
            "note": (
                f"more than {limit} lines matched; the latest were left out: narrow from/to, group by less, "
                f"or raise limit (at most {MAX_LIMIT})"
                if report.truncated
                else ""
            ),
        }
    )
    wants_csv = format == "csv" or (format is None and CSV_TYPE in request.headers.get("accept", ""))
    return _csv(answer, dimensions) if wants_csv else answer


def _line(group: UsageGroup, names: dict[str, str]) -> UsageLine:
    return UsageLine(
        start=group.start,
        key=group.key_id,
        key_name=names.get(group.key_id) if group.key_id is not None else None,
        project=group.project,
        team=group.team,
        org=group.org,
        model=group.model,
        requests=group.requests,
        errors=group.failed,
        prompt_tokens=group.prompt_tokens,
        completion_tokens=group.completion_tokens,
        cached_tokens=group.cached_tokens,
        cost=round(group.cost, 9),
        refused={str(status): count for status, count in sorted(group.refused.items())},
        ttft_mean_ms=None if group.ttft_mean_ms is None else round(group.ttft_mean_ms, 1),
        tokens_per_s=None if group.tokens_per_s is None else round(group.tokens_per_s, 2),
    )


def _totals(lines: list[UsageLine]) -> UsageTotals:
    return UsageTotals(
        requests=sum(line.requests for line in lines),
        errors=sum(line.errors for line in lines),
        prompt_tokens=sum(line.prompt_tokens for line in lines),
        completion_tokens=sum(line.completion_tokens for line in lines),
        cached_tokens=sum(line.cached_tokens for line in lines),
        cost=round(sum(line.cost for line in lines), 9),
    )


def csv_columns(dimensions: list[DimensionName]) -> list[str]:
    """The CSV columns of an answer grouped by ``dimensions``: the bucket's start, those, the sums."""
    grouped = set(dimensions) | ({"key_name"} if "key" in dimensions else set())
    return [c for c in CSV_COLUMNS if c not in {"key", "key_name", *Dimension} or c in grouped]


def refusals_text(refused: dict[str, int]) -> str:
    """Refused requests by status as one CSV cell: ``429:3 400:1`` (empty: none)."""
    return " ".join(f"{status}:{count}" for status, count in refused.items())


def _csv(answer: UsageAnswer, dimensions: list[DimensionName]) -> Response:
    columns = csv_columns(dimensions)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for line in answer.lines:
        values = line.model_dump(mode="json")
        values["refused"] = refusals_text(line.refused)
        writer.writerow(["" if values[c] is None else values[c] for c in columns])
    headers = {TRUNCATED_HEADER: "true"} if answer.truncated else {}
    return Response(out.getvalue(), media_type=CSV_TYPE, headers=headers)
