"""``llmgw mirror``: weights kept by sha256 on the control plane."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import typer
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from llmgw.adminapi.schemas import BlobView
from llmgw.cli.options import AS_JSON, TOKEN, URL, client
from llmgw.cli.output import console, print_json, table
from llmgw.client.admin import AdminClient
from llmgw.errors import LlmgwError, ValidationFailed

app = typer.Typer(help="Weights kept by sha256 on the control plane.", no_args_is_help=True)


def upload(
    admin: AdminClient, file: Path, *, show_progress: bool = True, filename: str = ""
) -> dict[str, Any]:
    if not file.is_file():
        raise ValidationFailed(
            [("FILE", f"{file} is not a readable file")], "give the path of a weights file"
        )
    size = file.stat().st_size
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=console,
        disable=not show_progress,
        transient=True,
    ) as progress:
        name = filename or file.name
        task = progress.add_task(f"uploading {name}", total=size)
        with file.open("rb") as handle:
            answer = admin.upload_blob(name, handle, size, progress=lambda n: progress.advance(task, n))
    return answer.model_dump()


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
    """List what the mirror holds, and which control planes hold each file."""
    rows = client(url, token).blobs()
    if as_json:
        print_json(rows)
        return
    table(
        ["SHA256", "SIZE", "FILE", "KIND", "COPIES"],
        [(b.sha256, b.size, b.filename, b.kind, copies_of(b)) for b in rows],
    )


def pull_estimate(store_url: str, timeout_s: float = 5.0) -> tuple[int, int]:
    """(blobs, bytes) a new control plane pulls from its peers: every blob the store lists (each plane
    keeps the whole mirror)."""
    from llmgw.store.database import Store

    async def read() -> tuple[int, int]:
        store = await Store.open(store_url, timeout_s=timeout_s)
        try:
            blobs = await store.blobs.list()
        finally:
            await store.close()
        return len(blobs), sum(b.size for b in blobs)

    return asyncio.run(read())


def describe_pull(store_url: str, timeout_s: float = 5.0) -> str:
    """What ``server add`` says the new control plane will pull, or why it cannot say."""
    try:
        count, size = pull_estimate(store_url, timeout_s)
    except LlmgwError as error:
        return f"cannot tell what it will pull from its peers yet: {error}"
    if not count:
        return "the mirror is empty: it has nothing to pull"
    return (
        f"it will pull {count} blobs ({size} bytes, {size / (1 << 30):.1f} GiB) from its peers once it runs "
        "('llmgw mirror list' shows the copies)"
    )


def certificate_warning(name: str, cert: Path) -> str:
    """Why a control plane's mirror would refuse the peer with certificate ``cert``, or "" when none.

    A plane pulls from its peers with its own certificate as a TLS client and serves them as a
    server, so it needs both uses; certificates of older clusters had server use alone.
    """
    try:
        certificate = x509.load_pem_x509_certificate(cert.read_bytes())
        usages = set(certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except (OSError, ValueError, x509.ExtensionNotFound):
        usages = set()
    missing = [
        words
        for oid, words in (
            (ExtendedKeyUsageOID.SERVER_AUTH, "server"),
            (ExtendedKeyUsageOID.CLIENT_AUTH, "client"),
        )
        if oid not in usages
    ]
    if not missing:
        return ""
    return (
        f"the certificate of {name} ({cert}) lacks {' and '.join(missing)} use: the control planes' "
        "mirrors would refuse it, and it would neither pull blobs from its peers nor serve them; "
        f"issue it again with both uses ('llmgw server add' writes such a certificate for a new plane)"
    )


def copies_of(blob: BlobView) -> str:
    """The control planes holding a blob, as a listing shows them ("none yet" when none records it)."""
    return ", ".join(c.plane for c in blob.copies) or "none yet"
