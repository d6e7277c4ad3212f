"""``llmgw ctl limits``: what a key, project, team, organization or user may use.

::

    llmgw ctl limits set project:acme/ml/chat --rpm 600 --tpm 200000 --per-day 5000000
    llmgw ctl limits set team:acme/ml --usd-per-day 20 --usd-per-month 400
    llmgw ctl limits set key:key_0a1b2c3d --concurrent 4 --model tiny-chat --expires-in 30d
    llmgw ctl limits set project:acme/ml/eval --priority 2
    llmgw ctl limits get team:acme/ml --json
    llmgw ctl limits list --json
    llmgw ctl limits remove org:acme

``set`` replaces every limit of the subject (a limit not given is none).
"""

from __future__ import annotations

import time

import typer

from llmgw.adminapi.limits import LimitsView
from llmgw.cli.options import AS_JSON, TOKEN, URL, client
from llmgw.cli.output import console, print_json, table
from llmgw.cli.tenancy import seconds

limits_app = typer.Typer(
    help="Limits per key (key:ID), project, team, org or user: rates, concurrency, budgets, models.",
    no_args_is_help=True,
)
SUBJECT = typer.Argument(..., help="key:ID, project:ORG/TEAM/PROJECT, team:ORG/TEAM, org:ORG or user:NAME.")


def _show(rows: list[LimitsView], as_json: bool) -> None:
    if as_json:
        print_json(rows)
        return

    def cell(value: object) -> str:
        return "-" if value is None else str(value)

    table(
        [
            "SUBJECT",
            "RPM",
            "TPM",
            "CONCURRENT",
            "PER DAY",
            "PER MONTH",
            "MONEY/DAY",
            "MONEY/MONTH",
            "MODELS",
            "EXPIRES",
            "PRIORITY",
        ],
        [
            (
                v.subject,
                cell(v.requests_per_minute),
                cell(v.tokens_per_minute),
                cell(v.concurrent),
                cell(v.tokens_per_day),
                cell(v.tokens_per_month),
                cell(v.usd_per_day),
                cell(v.usd_per_month),
                ",".join(v.models) if v.models is not None else "-",
                time.strftime("%Y-%m-%d %H:%M", time.gmtime(v.expires_s)) if v.expires_s else "-",
                cell(v.priority),
            )
            for v in rows
        ],
    )


@limits_app.command("set")
def set_limits(
    subject: str = SUBJECT,
    rpm: int | None = typer.Option(None, "--rpm", help="Requests per minute."),
    tpm: int | None = typer.Option(None, "--tpm", help="Tokens (prompt + completion) per minute."),
    concurrent: int | None = typer.Option(None, "--concurrent", help="Requests answered at once."),
    per_day: int | None = typer.Option(None, "--per-day", help="Tokens per UTC day."),
    per_month: int | None = typer.Option(None, "--per-month", help="Tokens per UTC month."),
    usd_per_day: float | None = typer.Option(
        None, "--usd-per-day", min=0, help="Money per UTC day, in the cluster's currency (pricing.currency)."
    ),
    usd_per_month: float | None = typer.Option(
        None, "--usd-per-month", min=0, help="Money per UTC month, in the cluster's currency."
    ),
    model: list[str] | None = typer.Option(None, "--model", help="A model allowed (repeat); none: all."),
    expires_in: str | None = typer.Option(None, "--expires-in", help="Refuse requests after 3600, 12h, 30d."),
    priority: int | None = typer.Option(
        None,
        "--priority",
        min=0,
        max=9,
        help="Queue priority in a busy model's queue, 0 (sheddable) to 9; a key's only lowers its owners'.",
    ),
    url: str | None = URL,
    token: str | None = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """Set (replace) the limits of a subject."""
    body = {
        "requests_per_minute": rpm,
        "tokens_per_minute": tpm,
        "concurrent": concurrent,
        "tokens_per_day": per_day,
        "tokens_per_month": per_month,
        "usd_per_day": usd_per_day,
        "usd_per_month": usd_per_month,
        "models": model or None,
        "expires_s": time.time() + seconds(expires_in) if expires_in else None,
        "priority": priority,
    }
    view = client(url, token).set_limits(subject, {k: v for k, v in body.items() if v is not None})
    if as_json:
        print_json(view)
    else:
        console.print(f"limits of {view.subject} set")


@limits_app.command("get")
def get_limits(
    subject: str = SUBJECT, url: str | None = URL, token: str | None = TOKEN, as_json: bool = AS_JSON
) -> None:
    """The limits of one subject."""
    _show([client(url, token).limit(subject)], as_json)


@limits_app.command("list")
def list_limits(url: str | None = URL, token: str | None = TOKEN, as_json: bool = AS_JSON) -> None:
    """Every limit you may see."""
    _show(client(url, token).limits(), as_json)


@limits_app.command("remove")
def remove_limits(subject: str = SUBJECT, url: str | None = URL, token: str | None = TOKEN) -> None:
    """Remove every limit of a subject."""
    client(url, token).remove_limits(subject)
    console.print(f"limits of {subject} removed")
