"""A model definition made from files on this machine, what ``llmgw model serve`` and
``ctl model add --definition`` send, and the uploads that complete it.

:func:`definition` makes the definition of a GGUF file (a projector beside it
for a vision model) or of a safetensors repository folder, LoRA adapters
added, with placeholder checksums: it is checked before anything is uploaded,
so a refused input costs no transfer. :func:`fill_checksums` then uploads the
files into the mirror and puts their sha256 and size in it.
:func:`read_definition` reads a YAML or JSON definition file as it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from llmgw.client.admin import AdminClient
from llmgw.client.providerkeys import resolve_key
from llmgw.client.uploads import UploadProgress, upload_file
from llmgw.core.catalog import parse_model
from llmgw.core.engines import default_engine_for
from llmgw.errors import ValidationFailed

PLACEHOLDER_SHA = "0" * 64


def repository_files(folder: Path) -> tuple[Path, list[Path]]:
    """A safetensors repository's first weights file and its other files (config, tokenizer, shards)."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    weights = [p for p in files if p.suffix == ".safetensors"]
    problems = []
    if not weights:
        problems.append(("PATH", f"{folder} holds no .safetensors file"))
    if not any(p.name == "config.json" for p in files):
        problems.append(("PATH", f"{folder} holds no config.json; serve the whole repository folder"))
    if problems:
        raise ValidationFailed(
            problems, "give the folder of a safetensors repository (weights, config, tokenizer)"
        )
    return weights[0], [p for p in files if p != weights[0]]


def adapter_entry(name: str, path: Path) -> tuple[dict[str, Any], list[Path]]:
    """An adapter of the definition (placeholder checksums) and its files to upload, weights first."""
    if path.is_file():
        return {"name": name, "sha256": PLACEHOLDER_SHA, "filename": path.name}, [path]
    if not path.is_dir():
        raise ValidationFailed(
            [("--adapter", f"{path} is neither a GGUF file nor a PEFT adapter's folder")],
            "give the path of a GGUF LoRA file (llama.cpp) or of the folder a PEFT adapter was saved in",
        )
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    weights = [p for p in files if p.name.startswith("adapter_model.")]
    config = path / "adapter_config.json"
    if not weights or not config.is_file():
        raise ValidationFailed(
            [("--adapter", f"{path} holds no adapter_model.safetensors and adapter_config.json")],
            "give the folder a PEFT adapter was saved in, or a GGUF LoRA file for llama.cpp",
        )
    rest = [p for p in files if p != weights[0]]
    entry: dict[str, Any] = {
        "name": name,
        "sha256": PLACEHOLDER_SHA,
        "filename": weights[0].name,
        "files": [{"sha256": PLACEHOLDER_SHA, "filename": p.name} for p in rest],
    }
    try:
        rank = json.loads(config.read_text()).get("r")
    except (ValueError, OSError, AttributeError):
        rank = None
    if isinstance(rank, int) and rank > 0:
        entry["rank"] = rank
    return entry, [weights[0], *rest]


def definition(
    path: Path,
    *,
    name: str | None,
    fmt: str | None,
    engine: str | None,
    projector: Path | None,
    profile: dict[str, Any],
    replicas: dict[str, int],
    on_demand: bool,
    adapters: tuple[tuple[str, Path], ...] = (),
) -> tuple[dict[str, Any], list[Path]]:
    """The model definition (with placeholder checksums) and the files to upload, main file first."""
    fmt = fmt or ("safetensors" if path.is_dir() else "gguf")
    if fmt == "safetensors" and not path.is_dir():
        raise ValidationFailed([("--format", "safetensors takes the repository's folder, not a file")])
    if fmt == "gguf" and not path.is_file():
        raise ValidationFailed(
            [("PATH", f"{path} is not a GGUF file")], "give a .gguf file or --format safetensors"
        )
    if fmt == "safetensors":
        main, rest = repository_files(path)
    else:
        main, rest = path, []
    source: dict[str, Any] = {"sha256": PLACEHOLDER_SHA, "filename": main.name, "format": fmt}
    if rest:
        source["files"] = [{"sha256": PLACEHOLDER_SHA, "filename": p.name} for p in rest]
    uploads = [main, *rest]
    if projector is not None:
        source["projector"] = {"sha256": PLACEHOLDER_SHA, "filename": projector.name}
        uploads.append(projector)
    data: dict[str, Any] = {
        "name": name or (path.name if path.is_dir() else path.stem),
        "source": source,
        "profile": {"engine": engine or default_engine_for(fmt), **profile},
        "replicas": replicas,
        "on_demand": on_demand,
    }
    entries = []
    for adapter_name, adapter_path in adapters:
        entry, files = adapter_entry(adapter_name, adapter_path)
        entries.append(entry)
        uploads += files
    if entries:
        data["adapters"] = entries
    parse_model(data)  # refuse before uploading gigabytes
    return data, uploads


def fill_checksums(
    data: dict[str, Any], uploads: list[Path], admin: AdminClient, progress: UploadProgress | None = None
) -> None:
    """Upload each file into the mirror and put its sha256 and size in the definition (``uploads``:
    :func:`definition`'s, in its order)."""
    source = data["source"]
    slots = [source, *source.get("files", [])]
    if "projector" in source:
        slots.append(source["projector"])
    for adapter in data.get("adapters", []):
        slots += [adapter, *adapter.get("files", [])]
    for slot, file in zip(slots, uploads, strict=True):
        blob = upload_file(admin, file, progress=progress)
        slot["sha256"], slot["size"] = blob.sha256, file.stat().st_size


def read_definition(path: Path, name: str | None) -> dict[str, Any]:
    """A YAML or JSON model definition file (``name``: the name it gets instead of its own), its
    provider's key read from where the file says it is (:mod:`llmgw.client.providerkeys`)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ValidationFailed([("--definition", f"cannot read {path}: {error}")], "fix the file") from None
    if not isinstance(data, dict):
        return {"": data}
    if name:
        data["name"] = name
    return resolve_key(data)
