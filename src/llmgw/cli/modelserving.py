"""``llmgw model serve``: add a model and serve it in one step (C5.2).

A GGUF file runs on llama.cpp (with ``--projector`` for a vision model's
projector); a safetensors repository folder (``--format safetensors``, its
config and tokenizer beside the weights) runs on vLLM by default, on the
class of card and tensor-parallel degree given. ``--adapter NAME=PATH`` adds
a LoRA adapter: a PEFT folder (``adapter_config.json`` beside
``adapter_model.safetensors``; its rank read from the config) for vLLM, a GGUF
LoRA file for llama.cpp. The definition is checked before anything is
uploaded, so a refused flag costs no transfer.

``hf:ORG/REPO[@REVISION]`` (or ``ollama:NAME[:TAG]``) in place of a path pulls
the model into the mirror on the control plane first (``llmgw mirror pull``),
then adds the definition with the pull's catalog source.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

from llmgw.cli.ctl import TOKEN, URL, client, model_app
from llmgw.cli.mirror import upload_bar
from llmgw.cli.mirrorimports import HF_TOKEN, pull_model
from llmgw.cli.output import console
from llmgw.client.admin import AdminClient
from llmgw.client.definitions import PLACEHOLDER_SHA, definition, fill_checksums
from llmgw.core.catalog import parse_model
from llmgw.core.engines import default_engine_for
from llmgw.errors import LlmgwError, ValidationFailed

PULLED = ("hf:", "ollama:")
"""Prefixes of a model ``model serve`` pulls from its registry instead of reading from disk."""


def pulled_definition(
    source: str,
    *,
    name: str | None,
    engine: str | None,
    profile: dict[str, Any],
    replicas: dict[str, int],
    on_demand: bool,
) -> dict[str, Any]:
    """The definition of a model to pull, with a placeholder source until the pull gives the real one."""
    fmt = "safetensors" if source.startswith("hf:") else "gguf"
    default = source.split(":", 1)[1].split("@")[0].split("/")[-1].split(":")[0]
    filename = "model.safetensors" if fmt == "safetensors" else "model.gguf"
    data: dict[str, Any] = {
        "name": name or default,
        "source": {"sha256": PLACEHOLDER_SHA, "filename": filename, "format": fmt},
        "profile": {"engine": engine or default_engine_for(fmt), **profile},
        "replicas": replicas,
        "on_demand": on_demand,
    }
    parse_model(data)  # refuse before pulling gigabytes
    return data


@model_app.command("serve")
def model_serve(
    path: Path = typer.Argument(
        ...,
        help="A GGUF file, a safetensors repository's folder, or hf:ORG/REPO[@REVISION] "
        "(ollama:NAME[:TAG]) to pull into the mirror first.",
    ),
    name: str = typer.Option(
        None, "--name", help="The name clients ask for (default: the file or folder name)."
    ),
    fmt: str = typer.Option(None, "--format", help="gguf or safetensors (default: from PATH)."),
    engine: str = typer.Option(
        None, "--engine", help="llama.cpp (GGUF), or vllm, sglang, trtllm (safetensors)."
    ),
    projector: Path = typer.Option(
        None, "--projector", help="A GGUF vision model's projector (mmproj) file."
    ),
    gpu_class: str = typer.Option(
        None, "--gpu-class", help="The class of card a replica needs (a100-80g, h100)."
    ),
    tp: int = typer.Option(1, "--tp", help="Cards one replica spans (tensor parallel; not llama.cpp)."),
    ctx_size: int = typer.Option(4096, "--ctx-size", help="Context of one request, in tokens."),
    parallel: int = typer.Option(4, "--parallel", help="Requests one replica serves at once."),
    min_replicas: int = typer.Option(1, "--min", help="Replicas kept running (0 with --on-demand)."),
    max_replicas: int = typer.Option(None, "--max", help="Replicas at most (default: --min, at least 1)."),
    on_demand: bool = typer.Option(
        False, "--on-demand", help="Start when a request arrives; stop when idle."
    ),
    adapter: list[str] = typer.Option(
        [], "--adapter", help="A LoRA adapter NAME=PATH: a PEFT folder (vLLM) or GGUF file (repeat for more)."
    ),
    max_loaded_adapters: int = typer.Option(
        0, "--max-loaded-adapters", help="vLLM: adapters a replica holds at once, loaded when asked (0: all)."
    ),
    serves: str = typer.Option(
        "chat", "--serves", help="What it serves: chat, embeddings or rerank (the routes that reach it)."
    ),
    pooling: str = typer.Option(
        None,
        "--pooling",
        help="llama.cpp, for embeddings: none, mean, cls, last or rank (default: the model's).",
    ),
    arg: list[str] = typer.Option([], "--arg", help="Extra engine argument (repeat for more)."),
    env: list[str] = typer.Option([], "--env", help="Engine tuning variable NAME=VALUE (repeat for more)."),
    wait: float = typer.Option(0, "--wait", help="Seconds to wait for a ready replica (0: return at once)."),
    hf_token: str | None = HF_TOKEN,
    url: str = URL,
    token: str = TOKEN,
) -> None:
    """Add a model to the catalog and serve it: its files go to the mirror, a replica starts."""
    variables = {}
    for item in env:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValidationFailed([("--env", f"{item!r} is not NAME=VALUE")])
        variables[key] = value
    profile: dict[str, Any] = {"ctx_size": ctx_size, "parallel": parallel, "tp": tp, "args": list(arg)}
    if variables:
        profile["env"] = variables
    if gpu_class:
        profile["gpu_class"] = gpu_class
    if max_loaded_adapters:
        profile["max_loaded_adapters"] = max_loaded_adapters
    if serves != "chat":
        profile["serves"] = serves
    if pooling:
        profile["pooling"] = pooling
    pairs = []
    for item in adapter:
        adapter_name, sep, adapter_path = item.partition("=")
        if not sep or not adapter_name or not adapter_path:
            raise ValidationFailed(
                [("--adapter", f"{item!r} is not NAME=PATH")], "write it as --adapter sql-helper=./sql-lora"
            )
        pairs.append((adapter_name, Path(adapter_path)))
    low = 0 if on_demand and min_replicas == 1 else min_replicas
    replicas = {"min": low, "max": max_replicas if max_replicas is not None else max(low, 1)}
    if str(path).startswith(PULLED):
        if projector is not None or pairs or fmt:
            raise ValidationFailed(
                [("PATH", f"{path} is pulled whole: --projector, --adapter and --format do not apply")],
                "leave those flags out; a pulled model's files and format come from its registry",
            )
        data = pulled_definition(
            str(path), name=name, engine=engine, profile=profile, replicas=replicas, on_demand=on_demand
        )
        admin = client(url, token)
        data["source"] = pull_model(admin, str(path), hf_token)["catalog_source"]
        serve(admin, data, wait)
        return
    data, uploads = definition(
        path,
        name=name,
        fmt=fmt,
        engine=engine,
        projector=projector,
        profile=profile,
        replicas=replicas,
        on_demand=on_demand,
        adapters=tuple(pairs),
    )
    admin = client(url, token)
    with upload_bar() as progress:
        fill_checksums(data, uploads, admin, progress)
    serve(admin, data, wait)


def serve(admin: AdminClient, data: dict[str, Any], wait: float) -> None:
    """Add the model and, with ``wait``, wait for a ready replica."""
    added = admin.request("POST", "/api/models", data)
    console.print(f"serving [bold]{added['name']}[/] on {data['profile']['engine']}")
    if wait > 0:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            replicas = [r for r in admin.get("/api/replicas") if r["model"] == added["name"]]
            if any(r["state"] == "ready" for r in replicas):
                console.print(f"{added['name']} is ready")
                return
            time.sleep(0.5)
        raise LlmgwError(
            f"no replica of {added['name']} was ready within {wait:g} s",
            "'llmgw ctl replicas' shows where it is and why it is not ready",
        )
