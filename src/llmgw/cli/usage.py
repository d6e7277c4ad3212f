"""``llmgw ctl usage``: requests, tokens, cost, errors, time to first token and tokens per second, per hour,
day or month and per key, project, team, organization or model — what the caller may read of it.

A table by default, its last line the totals; ``--json`` prints ``/api/usage``'s answer, ``--csv`` its CSV.
An answer cut at ``--limit`` says so (on stderr, so the JSON or CSV stays whole).
"""

from __future__ import annotations

import sys
from datetime import datetime
from typing import get_args

import typer

from llmgw.adminapi.usage import MAX_LIMIT, BucketName, DimensionName, UsageAnswer, UsageLine
from llmgw.cli.options import AS_JSON, TOKEN, URL, client
from llmgw.cli.output import errors, print_json, table

DIMENSIONS: tuple[str, ...] = get_args(DimensionName)
BUCKETS: tuple[str, ...] = get_args(BucketName)

STARTS = {"hour": "%Y-%m-%d %H:00", "day": "%Y-%m-%d", "month": "%Y-%m"}
"""How a bucket's start is shown in the table."""


def dimensions(values: list[str]) -> list[str]:
    """The ``--group-by`` values, each one or comma-separated; BadParameter naming the known ones."""
    chosen = [d.strip() for value in values for d in value.split(",") if d.strip()]
    unknown = [d for d in chosen if d not in DIMENSIONS]
    if unknown:
        raise typer.BadParameter(
            f"{', '.join(unknown)}: group by any of {', '.join(DIMENSIONS)}", param_hint="--group-by"
        )
    return list(dict.fromkeys(chosen)) or ["model"]


def usage(
    group_by: list[str] = typer.Option(
        [],
        "--group-by",
        "-g",
        help=f"Group by any of {', '.join(DIMENSIONS)} (repeat it, or a,b). Default: model.",
    ),
    by: str = typer.Option("day", "--by", help="Time buckets: hour, day or month (UTC)."),
    since: str = typer.Option(
        "", "--from", help="From this time, ISO 8601 (2026-03-01 or 2026-03-01T09:00Z)."
    ),
    until: str = typer.Option("", "--to", help="Before this time, ISO 8601."),
    limit: int = typer.Option(1000, "--limit", "-n", min=1, max=MAX_LIMIT, help="The most lines."),
    url: str | None = URL,
    token: str | None = TOKEN,
    as_json: bool = AS_JSON,
    as_csv: bool = typer.Option(False, "--csv", help="Print CSV instead of a table."),
) -> None:
    """Usage you may read, summed per time bucket and group."""
    if by not in BUCKETS:
        raise typer.BadParameter(f"{by}: give one of {', '.join(BUCKETS)}", param_hint="--by")
    if as_json and as_csv:
        raise typer.BadParameter("give one of --json and --csv", param_hint="--json/--csv")
    grouped = dimensions(group_by)
    query = [*(("group_by", d) for d in grouped), ("by", by), ("limit", str(limit))]
    query += [(name, value) for name, value in (("from", since), ("to", until)) if value]
    admin = client(url, token)
    if as_csv:
        text, truncated = admin.usage_csv(query)
        sys.stdout.write(text)
        if truncated:
            errors.print(f"more than {limit} lines matched; the latest were left out (raise --limit)")
        return
    answer = admin.usage(query)
    if as_json:
        print_json(answer)
    else:
        show(answer, grouped)
    if answer.truncated:
        errors.print(answer.note, highlight=False)


def show(answer: UsageAnswer, grouped: list[str]) -> None:
    columns = ["START", *(d.upper() for d in grouped)]
    columns += [
        "REQUESTS",
        "ERRORS",
        "REFUSED",
        "PROMPT",
        "CACHED",
        "COMPLETION",
        f"COST ({answer.currency})",
    ]
    columns += ["TTFT MEAN (ms)", "TOKENS/S"]
    rows = [_row(line, answer.by, grouped) for line in answer.lines]
    if rows:
        t = answer.totals
        rows.append(["TOTAL", *("" for _ in grouped), t.requests, t.errors, "", t.prompt_tokens,
                     t.cached_tokens, t.completion_tokens, cost_text(t.cost), "", ""])  # fmt: skip
    table(columns, rows)


def cost_text(cost: float) -> str:
    """A cost as a person reads it: cents and below shown to the millionth."""
    return f"{cost:.2f}" if cost >= 100 else f"{cost:.6f}"


def _row(line: UsageLine, by: str, grouped: list[str]) -> list[object]:
    named = {
        "key": f"{line.key_name} ({line.key})" if line.key_name else line.key,
        "project": line.project,
        "team": line.team,
        "org": line.org,
        "model": line.model,
    }
    return [
        _start(line.start, by),
        *(named[d] or "-" for d in grouped),
        line.requests,
        line.errors,
        " ".join(f"{status}:{count}" for status, count in line.refused.items()) or "-",
        line.prompt_tokens,
        line.cached_tokens,
        line.completion_tokens,
        cost_text(line.cost),
        "-" if line.ttft_mean_ms is None else f"{line.ttft_mean_ms:.0f}",
        "-" if line.tokens_per_s is None else f"{line.tokens_per_s:.1f}",
    ]


def _start(start: datetime, by: str) -> str:
    return start.strftime(STARTS[by])
