"""``llmgw ctl batch``: the batches clients made on ``/v1/batches``, followed and cancelled (docs/batches.md).

::

    llmgw ctl batch list [--running] [--json]
    llmgw ctl batch show batch_0a1b… [--watch] [--json]
    llmgw ctl batch cancel batch_0a1b…
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import typer
from pydantic import TypeAdapter
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from llmgw.adminapi.batches import BatchView
from llmgw.cli.options import AS_JSON, TOKEN, URL, client
from llmgw.cli.output import console, print_json, table

batch_app = typer.Typer(
    help="Follow and cancel the batches clients made (/v1/batches).", no_args_is_help=True
)
BATCH = typer.Argument(..., help="The batch's id (batch_…, 'llmgw ctl batch list' shows them).")
BATCHES = "/api/batches"
ENDED = ("completed", "failed", "expired", "cancelled")
WATCH_S = 1.0
"""How often ``show --watch`` reads the batch again."""


def _batches(answer: Any) -> list[BatchView]:
    return TypeAdapter(list[BatchView]).validate_python(answer)


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _show(batch: BatchView) -> None:
    rows = [
        ("status", batch.status),
        ("owner", batch.owner),
        ("key", batch.key_id),
        ("endpoint", batch.endpoint),
        ("requests", f"{batch.answered} of {batch.total} answered ({batch.failed} failed)"),
        ("tokens", f"{batch.input_tokens} in, {batch.output_tokens} out"),
        ("input file", batch.input_file_id),
        ("output file", batch.output_file_id or "-"),
        ("error file", batch.error_file_id or "-"),
        ("created", batch.created_at.strftime("%Y-%m-%d %H:%M:%S")),
        ("expires", batch.expires_at.strftime("%Y-%m-%d %H:%M:%S")),
    ]
    rows += [(status, _when(at)) for status, at in batch.times.items()]
    rows += [(f"error line {e.get('line') or '-'}", str(e.get("message", ""))) for e in batch.errors]
    table(["", batch.id], rows)


@batch_app.command("list")
def list_batches(
    running: bool = typer.Option(False, "--running", help="Only batches not ended."),
    url: str | None = URL,
    token: str | None = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """The batches you see, newest first, with how far each got."""
    path = f"{BATCHES}?unended=true" if running else BATCHES
    batches = _batches(client(url, token).request("GET", path))
    if as_json:
        print_json(batches)
        return
    table(
        ["ID", "OWNER", "ENDPOINT", "STATUS", "ANSWERED", "FAILED", "CREATED"],
        [
            (
                b.id,
                b.owner,
                b.endpoint,
                b.status,
                f"{b.answered}/{b.total}",
                b.failed,
                b.created_at.strftime("%Y-%m-%d %H:%M"),
            )
            for b in batches
        ],
    )


@batch_app.command("show")
def show(
    batch_id: str = BATCH,
    watch: bool = typer.Option(False, "--watch", help="Draw its progress until it ends."),
    url: str | None = URL,
    token: str | None = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """A batch's status, requests answered and failed of how many, tokens and files."""
    admin = client(url, token)
    batch = BatchView.model_validate(admin.request("GET", f"{BATCHES}/{batch_id}"))
    if watch and batch.status not in ENDED:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=as_json) as progress:
            task = progress.add_task(batch.status, total=batch.total or None, completed=batch.answered)
            while batch.status not in ENDED:
                time.sleep(WATCH_S)
                batch = BatchView.model_validate(admin.request("GET", f"{BATCHES}/{batch_id}"))
                progress.update(
                    task, description=batch.status, total=batch.total or None, completed=batch.answered
                )
    if as_json:
        print_json(batch)
    else:
        _show(batch)


@batch_app.command("cancel")
def cancel(
    batch_id: str = BATCH, url: str | None = URL, token: str | None = TOKEN, as_json: bool = AS_JSON
) -> None:
    """Cancel a batch: what is in flight finishes, the rest is answered batch_cancelled."""
    batch = BatchView.model_validate(client(url, token).request("POST", f"{BATCHES}/{batch_id}/cancel"))
    if as_json:
        print_json(batch)
    else:
        console.print(f"batch {batch.id} {batch.status} ({batch.answered} of {batch.total} answered)")
