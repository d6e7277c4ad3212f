"""``llmgw mirror pull``, ``import-hf`` and ``import-ollama``: models from where people keep them.

``pull hf:ORG/REPO[@REV]`` / ``pull ollama:NAME[:TAG]`` runs on the control
plane (``POST /api/mirror/pulls``) and is followed here until it ends.
``import-hf DIR`` and ``import-ollama [NAME]`` read a Hugging Face snapshot or
hub cache, or Ollama's models folder, on this machine, check each file against
the checksum its registry named it by, and upload it into the mirror. Each
prints the model's catalog source (the ``source`` of a model definition).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TransferSpeedColumn

from llmgw.cli.mirror import app, upload
from llmgw.cli.options import AS_JSON, TOKEN, URL, client
from llmgw.cli.output import console, print_json, table
from llmgw.client.admin import AdminClient
from llmgw.errors import ChecksumMismatch, LlmgwError
from llmgw.mirror import huggingface, ollama

HF_TOKEN = typer.Option(
    None,
    "--hf-token",
    envvar="HF_TOKEN",
    show_envvar=True,
    help="A Hugging Face token for gated or private repositories, sent for this pull alone "
    "(default: the control plane's own HF_TOKEN, if any).",
)
POLL_S = 0.5


def start_pull(admin: AdminClient, source: str, hf_token: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"source": source}
    if hf_token:
        body["hf_token"] = hf_token
    answer: dict[str, Any] = admin.request("POST", "/api/mirror/pulls", body)
    return answer


def follow_pull(admin: AdminClient, pull: dict[str, Any], *, show_progress: bool = True) -> dict[str, Any]:
    """The pull once it ended, with a progress bar per file meanwhile; LlmgwError when it failed."""
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=console,
        disable=not show_progress,
        transient=True,
    ) as progress:
        bars: dict[str, TaskID] = {}
        while True:
            for file in pull["files"]:
                if file["filename"] not in bars:
                    bars[file["filename"]] = progress.add_task(file["filename"], total=file["size"])
                progress.update(bars[file["filename"]], completed=file["done"])
            if pull["state"] != "running":
                break
            time.sleep(POLL_S)
            pull = admin.get(f"/api/mirror/pulls/{pull['id']}")
    if pull["state"] == "failed":
        raise LlmgwError(f"pull {pull['source']} failed: {pull['error']}", pull["hint"])
    return pull


def pull_model(
    admin: AdminClient, source: str, hf_token: str | None, *, show_progress: bool = True
) -> dict[str, Any]:
    """Pull ``source`` into the mirror on the control plane and wait for it; the finished pull."""
    return follow_pull(admin, start_pull(admin, source, hf_token), show_progress=show_progress)


def show_source(rows: list[tuple[str, int, str, str]], source: dict[str, Any]) -> None:
    table(["FILE", "SIZE", "SHA256", "CHECKED BY"], rows)
    console.print("catalog source (the model definition's source):")
    print(json.dumps(source, indent=2))


@app.command("pull")
def pull(
    source: str = typer.Argument(..., help="hf:ORG/REPO[@REVISION] or ollama:NAME[:TAG]."),
    hf_token: str | None = HF_TOKEN,
    url: str | None = URL,
    token: str | None = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """Pull a model from Hugging Face or Ollama's registry into the mirror (run by the control plane,
    resumable, each file checked against the registry's checksum); prints its catalog source."""
    done = pull_model(client(url, token), source, hf_token, show_progress=not as_json)
    if as_json:
        print_json(done)
        return
    rows = [(f["filename"], f["size"], f["sha256"], f["checked_by"]) for f in done["files"]]
    console.print(f"pulled {done['source']} ({done['revision']}): {done['bytes_total']} bytes")
    show_source(rows, done["catalog_source"])


def upload_checked(admin: AdminClient, path: Path, filename: str, sha256: str) -> dict[str, Any]:
    """Upload a file already checked to hash to ``sha256``; refuses if the mirror computed another."""
    answer = upload(admin, path, filename=filename)
    if answer["sha256"] != sha256:
        raise ChecksumMismatch(
            f"{filename}: the mirror received bytes hashing to {answer['sha256']}, not {sha256}",
            "the file changed while it was uploaded; import it again",
        )
    return answer


@app.command("import-hf")
def import_hf(
    directory: Path = typer.Argument(
        ..., help="A Hugging Face snapshot folder, or a hub cache entry (models--ORG--NAME)."
    ),
    url: str | None = URL,
    token: str | None = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """Import a safetensors repository from disk, each file checked against the hub's checksum
    (the name of its blob in the hub cache); prints its catalog source."""
    admin = client(url, token)
    rows, kept = [], []
    for file in huggingface.local_files(directory):
        with console.status(f"checking {file.name}"):
            sha256, size = huggingface.check_local(file)
        upload_checked(admin, file.path, file.name, sha256)
        rows.append((file.name, size, sha256, file.checked_by))
        kept.append((file.name, sha256, size))
    source = huggingface.safetensors_source(kept)
    if as_json:
        print_json(
            {
                "files": [
                    dict(zip(("filename", "size", "sha256", "checked_by"), r, strict=True)) for r in rows
                ],
                "catalog_source": source,
            }
        )
        return
    show_source(rows, source)


@app.command("import-ollama")
def import_ollama(
    name: str | None = typer.Argument(None, help="NAME[:TAG] of a model Ollama holds; none: list them."),
    models: Path | None = typer.Option(
        None, "--models", help="Ollama's models folder (default: $OLLAMA_MODELS, else ~/.ollama/models)."
    ),
    url: str | None = URL,
    token: str | None = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """Import an Ollama model's GGUF weights (and a vision model's projector) from Ollama's models
    folder, each checked against the digest Ollama named its blob by; without NAME, list the models."""
    folder = models or ollama.models_folder()
    if name is None:
        found = [str(m).removeprefix("ollama:") for m in ollama.local_models(folder)]
        if as_json:
            print_json(found)
        elif found:
            table(["MODEL"], [(m,) for m in found], title=str(folder))
        else:
            console.print(f"no Ollama models in {folder} (set OLLAMA_MODELS or --models to its folder)")
        return
    model = ollama.parse_name(name)
    layers, weights, projector = ollama.local_layers(folder, model)
    parts = [(model.filename, weights, layers.model)]
    if projector is not None and layers.projector is not None:
        parts.append(("mmproj.gguf", projector, layers.projector))
    admin = client(url, token)
    rows = []
    for filename, path, layer in parts:
        with console.status(f"checking {filename}"):
            ollama.check_blob(path, layer, filename)
        upload_checked(admin, path, filename, layer.sha256)
        rows.append((filename, layer.size, layer.sha256, "sha256 (Ollama's digest)"))
    source = ollama.gguf_source(
        model,
        (layers.model.sha256, layers.model.size),
        (layers.projector.sha256, layers.projector.size) if len(parts) > 1 and layers.projector else None,
    )
    if as_json:
        print_json(
            {
                "files": [
                    dict(zip(("filename", "size", "sha256", "checked_by"), r, strict=True)) for r in rows
                ],
                "catalog_source": source,
            }
        )
        return
    show_source(rows, source)
