"""``llmgw engine``: engine builds on this machine.

``install`` takes a build as a node does: the first that installs and
computes here (C4.2, :mod:`llmgw.engines.buildverdicts`), refusing the others
with what their check saw; ``--retry-refused`` forgets an engine's refusals
first, so they are tried again.
"""

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
from llmgw.core.devices import NodeInventory
from llmgw.engines import builds, buildverdicts, checking, pythonbuilds
from llmgw.engines.buildverdicts import NodeConditions
from llmgw.errors import LlmgwError

app = typer.Typer(help="Engine builds on this machine.", no_args_is_help=True)

DEFAULT_CACHE = Path(os.environ.get("LLMGW_CACHE", "~/.cache/llmgw"))
"""Where engine builds are kept: ``$LLMGW_CACHE`` or ``~/.cache/llmgw``."""
PROC_VERSION = Path("/proc/driver/nvidia/version")


def _node(inventory: NodeInventory) -> NodeConditions:
    return NodeConditions.of(inventory.driver_version, (gpu.name for gpu in inventory.gpus))


def _say_retried(cache: Path, engine: str) -> None:
    for verdict in buildverdicts.refusals(cache, engine):
        console.print(f"{engine} {verdict.build}: refused on {verdict.checked_at}, tried again")


def show_refusals(cache: Path, engine: str, node: NodeConditions) -> None:
    """Each build of ``engine`` refused on this machine as it is now, with what its check saw."""
    for verdict in buildverdicts.refusals(cache, engine):
        if verdict.holds(node):
            console.print(
                f"[yellow]refused[/] {engine} {verdict.build}: {verdict.found}\n  [bold]fix:[/] {verdict.fix}"
            )


def install_engine(
    cache_dir: Path = DEFAULT_CACHE,
    settings: LlamaCppSettings | None = None,
    *,
    nvidia_smi: str = "nvidia-smi",
    proc_version: Path = PROC_VERSION,
    retry_refused: bool = False,
) -> builds.InstalledBuild:
    """Install the best llama.cpp build that computes on this machine (or find it installed and accepted),
    showing progress and every build refused here."""
    settings = settings or LlamaCppSettings()
    cache = cache_dir.expanduser()
    if retry_refused:
        _say_retried(cache, builds.LLAMACPP)
    node = NodeConditions()

    async def run() -> builds.InstalledBuild:
        nonlocal node
        inventory = await discover("local", "127.0.0.1", nvidia_smi=nvidia_smi, proc_version=proc_version)
        node = _node(inventory)
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
                candidates,
                cache,
                check=checking.LlamaCppBuildCheck(node),
                progress=show,
                release_api=settings.release_api,
                pypi_url=settings.pypi_url,
                retry_refused=retry_refused,
            )

    try:
        installed = asyncio.run(run())
    finally:
        show_refusals(cache, builds.LLAMACPP, node)
    console.print(f"llama.cpp {installed.build.version} ({installed.build.variant}) at {installed.binary}")
    if installed.check is not None:
        console.print(f"[green]accepted[/] {installed.check.found} ({installed.check.node})")
    return installed


def install_python_engine(
    engine: str,
    cache_dir: Path = DEFAULT_CACHE,
    version: str = "",
    torch_index: str | None = None,
    *,
    index_url: str = pythonbuilds.PYPI_SIMPLE_URL,
    nvidia_smi: str = "nvidia-smi",
    proc_version: Path = PROC_VERSION,
    retry_refused: bool = False,
) -> Path:
    """Install the first vLLM or SGLang build that computes on this machine (vLLM's CPU build where it
    has no NVIDIA card), as a node does; the program it runs from."""
    cache = cache_dir.expanduser()
    if retry_refused:
        _say_retried(cache, engine)
    node = NodeConditions()

    async def run() -> pythonbuilds.InstalledPythonBuild:
        nonlocal node
        inventory = await discover("local", "127.0.0.1", nvidia_smi=nvidia_smi, proc_version=proc_version)
        node = _node(inventory)
        candidates = pythonbuilds.LISTINGS[engine](
            driver_version=inventory.driver_version or None,
            capabilities=[pythonbuilds.compute_capability(gpu.name) for gpu in inventory.gpus],
            version=version,
        )

        def show(message: str, fraction: float | None) -> None:
            console.print(f"{engine}: {message}"[:160])

        return await pythonbuilds.install_first(
            candidates,
            cache,
            node=node,
            index_url=index_url,
            progress=show,
            torch_index=torch_index,
            retry_refused=retry_refused,
        )

    try:
        installed = asyncio.run(run())
    finally:
        show_refusals(cache, engine, node)
    console.print(f"{engine} {installed.build.key} at {installed.program}")
    if installed.check is not None:
        console.print(f"[green]accepted[/] {installed.check.found} ({installed.check.node})")
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
    index_url: str = typer.Option(
        pythonbuilds.PYPI_SIMPLE_URL,
        "--index-url",
        help="vLLM, SGLang: the package index to install from (a mirror's: that index alone).",
    ),
    retry_refused: bool = typer.Option(
        False,
        "--retry-refused",
        help="Forget the builds this machine refused (they failed their check here), and try them again.",
    ),
    nvidia_smi: str = typer.Option("nvidia-smi", "--nvidia-smi", help="nvidia-smi to find the cards with."),
    proc_version: Path = typer.Option(
        PROC_VERSION, help="The NVIDIA kernel module's version file.", hidden=True
    ),
) -> None:
    """Install the best build of an engine that computes on this machine, as a node would, into the cache.

    Each build is checked before it is accepted (llama.cpp: a token with every layer on the card, or on a
    machine without NVIDIA cards a token on the CPU; vLLM, SGLang: the compiled extension imports and torch
    sees the card). A build that fails is refused, the refusal kept in the cache and shown, and the next
    one is tried; a refused build is not tried again until the driver or cards change or --retry-refused.
    """
    if engine in (builds.LLAMACPP, "llamacpp"):
        install_engine(
            cache_dir, nvidia_smi=nvidia_smi, proc_version=proc_version, retry_refused=retry_refused
        )
        return
    if engine not in pythonbuilds.LISTINGS:
        known = ", ".join([builds.LLAMACPP, *sorted(pythonbuilds.LISTINGS)])
        raise LlmgwError(f"no engine {engine!r} is installed by llmgw", f"give one of {known}")
    install_python_engine(
        engine,
        cache_dir,
        version,
        torch_index_url,
        index_url=index_url,
        nvidia_smi=nvidia_smi,
        proc_version=proc_version,
        retry_refused=retry_refused,
    )


@app.command("list")
def list_builds(
    cache_dir: Path = typer.Option(DEFAULT_CACHE, "--cache-dir", help="Where builds are kept."),
) -> None:
    """Engine builds installed on this machine, best first, with the check each passed here."""
    cache = cache_dir.expanduser()
    rows: list[tuple[builds.Build | pythonbuilds.PythonBuild, Path, buildverdicts.Verdict | None]]
    rows = [(b.build, b.binary, b.check) for b in builds.installed(cache)]
    rows += [(b.build, b.program, b.check) for b in pythonbuilds.installed_python_builds(cache)]

    def checked(build: builds.Build | pythonbuilds.PythonBuild, verdict: buildverdicts.Verdict | None) -> str:
        refused = buildverdicts.refusal(cache, build.engine, build.key)
        if refused is not None and (verdict is None or refused.checked_at >= verdict.checked_at):
            return f"refused {refused.checked_at}"
        return f"passed {verdict.checked_at}" if verdict is not None else "not checked"

    table(
        ["ENGINE", "VERSION", "VARIANT", "CHECK", "BINARY"],
        [(b.engine, b.version, b.variant, checked(b, v), path) for b, path, v in rows],
    )
