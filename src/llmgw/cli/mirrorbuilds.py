"""``llmgw mirror add-build``: llama.cpp's release builds, or vLLM's and SGLang's wheels, fetched once into
the mirror (C4.2).

The command is part of ``ctl mirror`` too, so its module imports only what
declaring it needs: the server's configuration, the mirror's and the engines'
modules are imported where they are used, and ``ctl`` does without them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from llmgw.cli.output import console
from llmgw.client.paths import find_server_config
from llmgw.core.engines import LLAMA_CPP
from llmgw.errors import ConfigError

if TYPE_CHECKING:
    from llmgw.controlplane.config import ServerConfig
    from llmgw.engines.pythonbuilds import PythonBuild
    from llmgw.mirror.blobs import BlobStore
    from llmgw.mirror.builds import BuildIndex

CONFIG = typer.Option(None, "--config", help="The control plane's server.yaml (default: the one found).")


def server_config(path: Path | None) -> ServerConfig:
    """The control plane's configuration at ``path``, or the one found where llmgw looks."""
    found = path or find_server_config()
    if found is None:
        raise ConfigError(
            "no server.yaml found", hint="run this on a control plane's machine, or pass --config PATH"
        )
    from llmgw.controlplane.config import load_server_config

    return load_server_config(found)


def mirror_of(config: ServerConfig) -> tuple[BlobStore, BuildIndex]:
    from llmgw.mirror.blobs import BlobStore
    from llmgw.mirror.builds import BuildIndex

    root = config.data_path / "mirror"
    return BlobStore(root), BuildIndex(root)


def add_build(
    engine: str = typer.Argument(
        LLAMA_CPP.name,
        help="llama.cpp[@TAG] (release builds; default tag: pinned), or vllm[@VERSION] / sglang[@VERSION] "
        "(a wheelhouse; default version: pinned).",
    ),
    variant: str | None = typer.Option(
        None,
        "--variant",
        help="llama.cpp: cuda-13.4, cuda-12.8, vulkan or cpu; vLLM/SGLang: cu130 or cu129 (default: all).",
    ),
    arch: str | None = typer.Option(None, "--arch", help="llama.cpp: x64, arm64 or s390x (default: all)."),
    index_url: str | None = typer.Option(
        None, "--index-url", help="vLLM/SGLang: the index the wheels come from (default: PyPI's)."
    ),
    python_version: str | None = typer.Option(
        None, "--python-version", help="vLLM/SGLang: the nodes' Python (pip's option; default: this one's)."
    ),
    pip_platform: str | None = typer.Option(
        None,
        "--platform",
        help="vLLM/SGLang: the nodes' platform tag (pip's option; default: this machine's).",
    ),
    config: Path | None = CONFIG,
) -> None:
    """Fetch engine builds into this control plane's mirror: llama.cpp's release builds (checked
    against the sha256 the release publishes) or a wheelhouse of vLLM's or SGLang's wheels; nodes
    install from them first (an offline cluster too)."""
    from llmgw.engines.pythonbuilds import PYPI_SIMPLE_URL
    from llmgw.mirror.builds import add_llamacpp_builds, llamacpp_targets, parse_engine
    from llmgw.mirror.wheelhouses import PYTHON_ENGINES, add_wheelhouse, python_build

    name, _, version = engine.partition("@")
    if name in PYTHON_ENGINES:
        blobs, index = mirror_of(server_config(config))
        options = [*(["--python-version", python_version] if python_version else []),
                   *(["--platform", pip_platform] if pip_platform else [])]  # fmt: skip
        variants = [variant] if variant else [b.variant for b in _listing(name, version)]
        for each in variants:
            asyncio.run(
                add_wheelhouse(
                    blobs,
                    index,
                    python_build(name, version, each),
                    index_url=index_url or PYPI_SIMPLE_URL,
                    pip_options=options,
                    say=console.print,
                )
            )
        console.print(
            f"the mirror holds {name} wheelhouses for {', '.join(variants)}; nodes are told as they register"
        )
        return
    _, tag = parse_engine(engine)
    targets = llamacpp_targets(variant, arch)
    blobs, index = mirror_of(server_config(config))
    added = asyncio.run(add_llamacpp_builds(blobs, index, tag, targets, say=console.print))
    console.print(f"the mirror holds {len(added)} llama.cpp {tag} builds; nodes are told as they register")


def _listing(engine: str, version: str) -> list[PythonBuild]:
    from llmgw.engines.pythonbuilds import every_variant

    return every_variant(engine, version)
