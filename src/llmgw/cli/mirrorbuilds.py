"""``llmgw mirror add-build``: llama.cpp's release builds fetched once into the mirror (C4.2)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from llmgw.cli.output import console
from llmgw.cli.paths import find_server_config
from llmgw.controlplane.config import ServerConfig, load_server_config
from llmgw.engines.builds import LLAMACPP
from llmgw.errors import ConfigError
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.builds import BuildIndex, add_llamacpp_builds, llamacpp_targets, parse_engine

CONFIG = typer.Option(None, "--config", help="The control plane's server.yaml (default: the one found).")


def server_config(path: Path | None) -> ServerConfig:
    """The control plane's configuration at ``path``, or the one found where llmgw looks."""
    found = path or find_server_config()
    if found is None:
        raise ConfigError(
            "no server.yaml found", hint="run this on a control plane's machine, or pass --config PATH"
        )
    return load_server_config(found)


def mirror_of(config: ServerConfig) -> tuple[BlobStore, BuildIndex]:
    root = config.data_path / "mirror"
    return BlobStore(root), BuildIndex(root)


def add_build(
    engine: str = typer.Argument(
        LLAMACPP, help="The engine, with a release tag: ENGINE@TAG (default tag: pinned)."
    ),
    variant: str | None = typer.Option(
        None, "--variant", help="cuda-13.4, cuda-12.8, vulkan or cpu (default: all)."
    ),
    arch: str | None = typer.Option(None, "--arch", help="x64, arm64 or s390x (default: all)."),
    config: Path | None = CONFIG,
) -> None:
    """Fetch llama.cpp's release builds into this control plane's mirror, checked against the
    sha256 the release publishes; nodes install from them first (an offline cluster too)."""
    _, tag = parse_engine(engine)
    targets = llamacpp_targets(variant, arch)
    blobs, index = mirror_of(server_config(config))
    added = asyncio.run(add_llamacpp_builds(blobs, index, tag, targets, say=console.print))
    console.print(f"the mirror holds {len(added)} llama.cpp {tag} builds; nodes are told as they register")
