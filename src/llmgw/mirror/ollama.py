"""Ollama models: names, the registry's manifests, and the models folder on disk.

A name is ``[NAMESPACE/]NAME[:TAG]`` (namespace ``library``, tag ``latest`` by
default, as Ollama's ``ParseModelPath``). The registry
(``mirror.ollama_registry``, ``https://registry.ollama.ai`` by default) answers
``GET /v2/{namespace}/{name}/manifests/{tag}`` (``Accept:
application/vnd.docker.distribution.manifest.v2+json``) with a manifest whose
``layers`` each carry a ``mediaType``, a ``sha256:`` ``digest`` and a ``size``;
a layer's bytes come from ``GET /v2/{namespace}/{name}/blobs/{digest}``
(``Range`` honoured). The weights are the layer of media type
``application/vnd.ollama.image.model`` (GGUF), a vision model's projector the
one of ``application/vnd.ollama.image.projector``.

On disk (``$OLLAMA_MODELS``, else ``~/.ollama/models``) the same manifest is
kept at ``manifests/registry.ollama.ai/{namespace}/{name}/{tag}`` and each layer
at ``blobs/sha256-<hex>``: named by the digest it is checked against.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw.errors import ChecksumMismatch, NotFound, ValidationFailed
from llmgw.mirror.blobs import hash_file

DEFAULT_REGISTRY = "https://registry.ollama.ai"
"""The registry's address when ``mirror.ollama_registry`` says no other."""
REGISTRY_HOST = "registry.ollama.ai"
"""The registry's name in a models folder's ``manifests/`` tree."""
MANIFEST_MEDIA_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
PROJECTOR_MEDIA_TYPE = "application/vnd.ollama.image.projector"

_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")


@dataclass(frozen=True)
class ModelName:
    """An Ollama model: namespace, name and tag."""

    name: str
    tag: str = "latest"
    namespace: str = "library"

    def __str__(self) -> str:
        prefix = "" if self.namespace == "library" else f"{self.namespace}/"
        return f"ollama:{prefix}{self.name}:{self.tag}"

    @property
    def filename(self) -> str:
        """The name the engine sees the weights under (``NAME-TAG.gguf``)."""
        return f"{self.name}-{self.tag}.gguf"


def parse_name(text: str) -> ModelName:
    """``[NAMESPACE/]NAME[:TAG]`` (an ``ollama:`` prefix is dropped), or ValidationFailed."""
    body = text.removeprefix("ollama:")
    path, _, tag = body.partition(":")
    parts = path.split("/")
    bad_tag = ":" in body and not _PART.fullmatch(tag)
    if len(parts) > 2 or not all(_PART.fullmatch(p) for p in parts) or bad_tag:
        raise ValidationFailed(
            [("source", f"{text!r} is not an Ollama model name")],
            "write it as ollama:NAME or ollama:NAME:TAG (e.g. ollama:llama3.2:1b)",
        )
    namespace = parts[0] if len(parts) == 2 else "library"
    return ModelName(parts[-1], tag or "latest", namespace)


@dataclass(frozen=True)
class Layer:
    """One layer of a manifest: what it is, its sha256 and size."""

    media_type: str
    sha256: str
    size: int


@dataclass(frozen=True)
class ModelLayers:
    """The layers llmgw takes from a manifest: the GGUF weights and a vision model's projector."""

    model: Layer
    projector: Layer | None


def parse_manifest(data: Any, name: ModelName) -> ModelLayers:
    """The weights and projector layers of a manifest; ValidationFailed naming what is missing."""
    layers = data.get("layers") if isinstance(data, dict) else None
    if not isinstance(layers, list):
        raise ValidationFailed(
            [("manifest", f"the manifest of {name} has no layers")],
            "check that mirror.ollama_registry names an Ollama registry (https://registry.ollama.ai)",
        )
    found: dict[str, Layer] = {}
    for layer in layers:
        if not isinstance(layer, dict):
            continue
        kind, digest, size = layer.get("mediaType"), str(layer.get("digest", "")), layer.get("size")
        if kind not in (MODEL_MEDIA_TYPE, PROJECTOR_MEDIA_TYPE):
            continue
        match = _DIGEST.fullmatch(digest)
        if match is None or not isinstance(size, int):
            raise ValidationFailed(
                [("manifest", f"{name}: layer {kind} has digest {digest!r} and size {size!r}")],
                "the registry's manifest is damaged; pull again later or from another registry",
            )
        found.setdefault(str(kind), Layer(str(kind), match.group(1), size))
    if MODEL_MEDIA_TYPE not in found:
        raise ValidationFailed(
            [("manifest", f"{name} has no layer of media type {MODEL_MEDIA_TYPE} (no GGUF weights)")],
            "pull a model made of GGUF weights (an Ollama chat or embedding model)",
        )
    return ModelLayers(found[MODEL_MEDIA_TYPE], found.get(PROJECTOR_MEDIA_TYPE))


def manifest_url(registry: str, name: ModelName) -> str:
    return f"{registry.rstrip('/')}/v2/{name.namespace}/{name.name}/manifests/{name.tag}"


def blob_url(registry: str, name: ModelName, sha256: str) -> str:
    return f"{registry.rstrip('/')}/v2/{name.namespace}/{name.name}/blobs/sha256:{sha256}"


def gguf_source(name: ModelName, model: tuple[str, int], projector: tuple[str, int] | None) -> dict[str, Any]:
    """A catalog source (``format: gguf``) from the weights' and projector's (sha256, size)."""
    source: dict[str, Any] = {"format": "gguf", "filename": name.filename}
    source["sha256"], source["size"] = model
    if projector is not None:
        source["projector"] = {"filename": "mmproj.gguf", "sha256": projector[0], "size": projector[1]}
    return source


def models_folder(environ: Mapping[str, str] = os.environ) -> Path:
    """Where Ollama keeps its models: ``$OLLAMA_MODELS``, else ``~/.ollama/models``."""
    return Path(environ.get("OLLAMA_MODELS") or "~/.ollama/models").expanduser()


def local_models(folder: Path) -> list[ModelName]:
    """Every model whose manifest the folder holds (of the default registry)."""
    root = folder / "manifests" / REGISTRY_HOST
    if not root.is_dir():
        return []
    found = []
    for manifest in sorted(root.glob("*/*/*")):
        if manifest.is_file():
            namespace, name, tag = manifest.relative_to(root).parts
            found.append(ModelName(name, tag, namespace))
    return found


def local_layers(folder: Path, name: ModelName) -> tuple[ModelLayers, Path, Path | None]:
    """A local model's layers and the paths of its weights and projector blobs."""
    manifest = folder / "manifests" / REGISTRY_HOST / name.namespace / name.name / name.tag
    if not manifest.is_file():
        present = ", ".join(str(m).removeprefix("ollama:") for m in local_models(folder)) or "none"
        raise NotFound(
            f"no Ollama model {str(name).removeprefix('ollama:')} in {folder} (present: {present})",
            "name one of those, or set OLLAMA_MODELS to the folder Ollama keeps its models in",
        )
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError) as error:
        raise ValidationFailed(
            [("manifest", f"{manifest} is not a JSON manifest: {error}")], "pull the model again with ollama"
        ) from error
    layers = parse_manifest(data, name)
    projector = blob_path(folder, layers.projector.sha256) if layers.projector else None
    return layers, blob_path(folder, layers.model.sha256), projector


def blob_path(folder: Path, sha256: str) -> Path:
    return folder / "blobs" / f"sha256-{sha256}"


def check_blob(path: Path, layer: Layer, what: str) -> None:
    """ChecksumMismatch (naming the file) unless the blob's bytes hash to the digest Ollama named it by."""
    if not path.is_file():
        raise NotFound(f"{what}: blob {path} is missing", "pull the model again with ollama")
    actual, _ = hash_file(path)
    if actual != layer.sha256:
        raise ChecksumMismatch(
            f"{what} ({path.name}): Ollama named it sha256 {layer.sha256}, its bytes hash to {actual}",
            "the blob is damaged: remove the model and pull it again with ollama",
        )
