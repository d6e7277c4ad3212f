"""``llmgw mirror``: weights kept by sha256 on the control plane."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TransferSpeedColumn

from llmgw.adminapi.schemas import BlobView, MirrorQuotaView
from llmgw.cli.options import AS_JSON, TOKEN, URL, client
from llmgw.cli.output import console, print_json, shown, table
from llmgw.client.admin import AdminClient
from llmgw.client.uploads import UploadProgress, upload_file
from llmgw.errors import NotFound

app = typer.Typer(help="Weights kept by sha256 on the control plane.", no_args_is_help=True)


@contextmanager
def upload_bar(show: bool = True) -> Iterator[UploadProgress]:
    """Where uploads say how far they are: a bar for each file while it goes, gone once it is sent
    (``show``: False draws nothing)."""
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=console,
        disable=not show,
        transient=True,
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(name: str, sent: int, size: int) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(f"uploading {name}", total=size)
            bar.update(tasks[name], completed=sent)
            if sent >= size:
                bar.remove_task(tasks.pop(name))

        yield progress


def upload(
    admin: AdminClient, file: Path, *, show_progress: bool = True, filename: str = ""
) -> dict[str, Any]:
    with upload_bar(show_progress) as progress:
        return upload_file(admin, file, filename=filename, progress=progress).model_dump()


@app.command("import")
def import_file(
    file: Path = typer.Argument(..., help="The file to import (e.g. a GGUF)."),
    url: str | None = URL,
    token: str | None = TOKEN,
) -> None:
    """Import a file into the mirror; prints its sha256 for model definitions."""
    answer = upload(client(url, token), file)
    console.print(f"imported {file.name}: {answer['size']} bytes")
    if answer.get("note"):
        console.print(f"copies: {answer['note']}")
    print(f"sha256:{answer['sha256']}")


@app.command("list")
def list_blobs(url: str | None = URL, token: str | None = TOKEN, as_json: bool = AS_JSON) -> None:
    """List what the mirror holds, whose each file is, which control planes hold it, and your use
    of the mirror against your quota (also 'ls')."""
    admin = client(url, token)
    rows = admin.blobs()
    if as_json:
        print_json(rows)
        return
    try:
        quota: MirrorQuotaView | None = admin.mirror_quota()
    except NotFound:  # a control plane older than quotas
        quota = None
    table(
        ["SHA256", "SIZE", "FILE", "KIND", "OWNER", "COPIES"],
        [
            (b.sha256, b.size, shown(b.filename), b.kind, shown(b.owner or "cluster"), copies_of(b))
            for b in rows
        ],
    )
    if quota is not None:
        console.print(use_of(quota), highlight=False)


app.command("ls", help="List what the mirror holds and your use against your quota (as 'list').")(list_blobs)


@app.command("rm")
def remove_blob(
    sha256: str = typer.Argument(..., help="The blob's sha256 ('sha256:' first or not), as 'ls' shows it."),
    url: str | None = URL,
    token: str | None = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """Remove a blob you uploaded (a cluster admin: any) from the mirror, on every control plane;
    refused while a model, adapter, engine build, training job or client file names it."""
    removed = client(url, token).remove_blob(sha256.strip())
    if as_json:
        print_json(removed)
        return
    console.print(
        f"removed sha256:{removed.sha256} ({shown(removed.filename)}, {removed.size} bytes); {removed.note}",
        highlight=False,
    )


def use_of(quota: MirrorQuotaView) -> str:
    """A user's use of the mirror, as a listing ends: bytes held of the quota, and the largest upload."""
    largest = f"largest upload {quota.max_upload_bytes} bytes"
    if quota.quota_bytes is None:
        return f"{quota.user} holds {quota.used_bytes} bytes in the mirror (no quota); {largest}"
    share = quota.used_bytes * 100 // quota.quota_bytes if quota.quota_bytes else 100
    return (
        f"{quota.user} holds {quota.used_bytes} of {quota.quota_bytes} bytes of quota ({share}%); {largest}; "
        "'llmgw ctl mirror rm SHA256' frees room"
    )


def copies_of(blob: BlobView) -> str:
    """The control planes holding a blob, as a listing shows them ("none yet" when none records it)."""
    return ", ".join(c.plane for c in blob.copies) or "none yet"
