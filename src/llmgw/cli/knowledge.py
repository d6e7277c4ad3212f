"""``llmgw ctl kb``: knowledge collections — create, upload documents or pairs, list, search, delete.

::

    llmgw ctl kb create handbook --owner team:acme/ml --embedding-model minilm
    llmgw ctl kb upload handbook guide.md manual.pdf
    llmgw ctl kb upload handbook qa.jsonl --pairs
    llmgw ctl kb list [handbook] [--json]
    llmgw ctl kb search handbook "how do I rotate the keys?" --limit 5 --mode hybrid
    llmgw ctl kb delete handbook [--document guide.md]
"""

from __future__ import annotations

import io
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote

import typer
from rich.progress import Progress

from llmgw.cli.options import AS_JSON, TOKEN, URL, client
from llmgw.cli.output import console, print_json, shown, table
from llmgw.client.admin import AdminClient
from llmgw.core.knowledge import SERVING_AN_EMBEDDING_MODEL
from llmgw.errors import LlmgwError

kb_app = typer.Typer(
    help="Knowledge collections: documents split, embedded and searched (docs/knowledge.md). "
    f"A collection needs an embedding model the cluster serves: {SERVING_AN_EMBEDDING_MODEL}.",
    no_args_is_help=True,
)
COLLECTION = typer.Argument(..., help="The collection's name.")
BASE = "/api/knowledge/collections"


def _path(*parts: str) -> str:
    return "/".join([BASE, *(quote(p, safe="") for p in parts)])


@kb_app.command(
    "create",
    help="Create an empty collection, embedded with a public model that serves embeddings: "
    f"{SERVING_AN_EMBEDDING_MODEL}.",
)
def create(
    name: str = COLLECTION,
    owner: str = typer.Option("", "--owner", help="org:, team:, project: or user: (default: the cluster)."),
    embedding_model: str = typer.Option(
        "",
        "--embedding-model",
        help="A public model with serves: embeddings (default: knowledge.embedding_model).",
    ),
    url: str | None = URL,
    token: str | None = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """Create an empty collection, embedded with a public model that serves embeddings."""
    body = {"name": name, "owner": owner, "embedding_model": embedding_model}
    made = client(url, token).request("POST", BASE, body)
    if as_json:
        print_json(made)
    else:
        console.print(f"collection {made['name']} created, embedded with {made['embedding_model']}")


@kb_app.command("upload")
def upload(
    name: str = COLLECTION,
    files: list[Path] = typer.Argument(..., help=".txt, .md, .html or .pdf files (or .jsonl with --pairs)."),
    pairs: bool = typer.Option(False, "--pairs", help='The files are JSON Lines of {"question", "answer"}.'),
    url: str | None = URL,
    token: str | None = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """Upload documents (each replaces one of its name), showing the passages embedded."""
    admin = client(url, token)
    results = []
    for file in files:
        if not file.is_file():
            raise LlmgwError(f"{file} is not a file", "name files that exist")
        data = file.read_bytes()
        if pairs:
            added = admin.request("POST", _path(name, "pairs"), data=io.BytesIO(data), length=len(data))
            results.append(added)
            if not as_json:
                console.print(f"{file.name}: {added['added']} pairs added ({added['pairs']} in {name})")
            continue
        document = _upload(admin, name, file.name, data, show=not as_json)
        results.append(document)
        if not as_json:
            console.print(f"{file.name}: {document['passages']} passages ({document['kind']})")
    if as_json:
        print_json(results)


def _upload(admin: AdminClient, collection: str, filename: str, data: bytes, show: bool) -> dict[str, Any]:
    """PUT the document with ?progress=true and follow its JSON Lines."""
    request = urllib.request.Request(
        admin.url + _path(collection, "documents", filename) + "?progress=true",
        data=data,
        method="PUT",
        headers={"Authorization": f"Bearer {admin.token}", "Content-Type": "application/octet-stream"},
    )
    try:
        response = urllib.request.urlopen(request)  # no timeout: a long document embeds for minutes
    except urllib.error.HTTPError as error:
        raise _refusal(error) from None
    except (urllib.error.URLError, OSError) as error:
        raise LlmgwError(
            f"cannot reach the control plane at {admin.url}: {getattr(error, 'reason', error)}",
            "check that it runs ('llmgw up' or 'llmgw server run')",
        ) from None
    with response, Progress(console=console, transient=True, disable=not show) as bar:
        task = bar.add_task(f"embedding {filename}", total=None)
        for raw in response:
            line = json.loads(raw)
            if "embedded" in line:
                bar.update(task, completed=line["embedded"], total=line["of"])
            elif "error" in line:
                raise LlmgwError(line["error"]["message"], line["error"].get("hint", ""))
            elif "document" in line:
                return dict(line["document"])
    raise LlmgwError(
        f"the upload of {filename} ended before the control plane said it was stored",
        "upload it again (nothing half-stored is kept)",
    )


def _refusal(error: urllib.error.HTTPError) -> LlmgwError:
    try:
        said = json.loads(error.read())["error"]
        return LlmgwError(str(said["message"]), str(said.get("hint", "")))
    except (ValueError, KeyError, TypeError):
        return LlmgwError(f"the control plane answered {error.code}", "see its log")


@kb_app.command("list")
def list_collections(
    name: str = typer.Argument("", help="A collection: list its documents instead."),
    url: str | None = URL,
    token: str | None = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """The collections you see, or one collection's documents."""
    admin = client(url, token)
    if name:
        detail = admin.request("GET", _path(name))
        if as_json:
            print_json(detail)
            return
        table(
            ["DOCUMENT", "KIND", "SIZE", "PASSAGES", "UPLOADED BY", "UPLOADED AT"],
            [
                (
                    shown(d["name"]),
                    d["kind"],
                    d["size"],
                    d["passages"],
                    d["uploaded_by"],
                    d["uploaded_at"][:19],
                )
                for d in detail["document_list"]
            ],
            title=f"{name} ({detail['owner'] or 'cluster'}, {detail['embedding_model']})",
        )
        return
    rows = admin.request("GET", BASE)
    if as_json:
        print_json(rows)
        return
    table(
        ["NAME", "OWNER", "EMBEDDING MODEL", "DOCUMENTS", "PASSAGES", "CREATED BY"],
        [
            (
                c["name"],
                c["owner"] or "cluster",
                c["embedding_model"],
                c["documents"],
                c["passages"],
                c["created_by"],
            )
            for c in rows
        ],
    )


@kb_app.command("search")
def search(
    collections: str = typer.Argument(..., help="Collections to search, comma-separated."),
    query: str = typer.Argument(..., help="What to look for."),
    limit: int = typer.Option(5, "--limit", help="Passages to show (1-100)."),
    mode: str = typer.Option(
        "hybrid", "--mode", help="hybrid (vector and keyword fused), vector or keyword."
    ),
    url: str | None = URL,
    token: str | None = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """The passages that best match a query, best first."""
    body = {
        "collections": [c for c in collections.split(",") if c],
        "query": query,
        "limit": limit,
        "mode": mode,
    }
    found = client(url, token).request("POST", "/api/knowledge/search", body)
    if as_json:
        print_json(found)
        return
    table(
        ["SCORE", "COLLECTION", "DOCUMENT", "#", "TEXT"],
        [
            (
                f"{p['score']:.4f}",
                p["collection"],
                shown(p["document"]),
                p["position"],
                " ".join(p["text"].split())[:120],
            )
            for p in found
        ],
    )


@kb_app.command("delete")
def delete(
    name: str = COLLECTION,
    document: str = typer.Option("", "--document", help="Remove only this document."),
    url: str | None = URL,
    token: str | None = TOKEN,
) -> None:
    """Delete a collection (with everything in it), or one document of it."""
    admin = client(url, token)
    if document:
        admin.request("DELETE", _path(name, "documents", document))
        console.print(f"document {shown(document)} removed from {name}")
    else:
        admin.request("DELETE", _path(name))
        console.print(f"collection {name} deleted")
