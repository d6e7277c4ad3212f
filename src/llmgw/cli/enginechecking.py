"""What ``llmgw ctl engine-check`` runs (:mod:`llmgw.cli.enginecheck` declares the command).

It runs the check an install runs (C4.2, C4.4) on the build the node uses
(or ``--bin``), and shows what the installs on this machine concluded: the
builds accepted here with the check each passed, and every build refused
here with what its check saw and the fix. Kept apart from the command's
options so that ``ctl`` loads the agent's and the engines' modules only when
this check runs.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import typer

from llmgw.agent.config import load_agent_config
from llmgw.agent.discovery import choose_source, parse_driver_version
from llmgw.agent.gpus import devices_of
from llmgw.cli.output import console
from llmgw.cli.up import bundled_model
from llmgw.core.engines import ENGINE_NAMES
from llmgw.engines import (
    builds,
    buildverdicts,
    checking,
    checkmodel,
    llamacpp,
    pythonbuilds,
    pythonchecks,
    trtllm,
)
from llmgw.engines.buildverdicts import CheckResult, NodeConditions, Verdict

ENGINES = ENGINE_NAMES


def _fail(message: str, fix: str) -> typer.Exit:
    console.print(f"[bold red]fail[/] {message}\n[bold]fix:[/] {fix}")
    return typer.Exit(1)


def _llamacpp_binary(cache_dir: Path, node: NodeConditions) -> tuple[Path, str] | CheckResult:
    """The build the node uses: the best accepted here, else the best not refused here (a CUDA build
    first on a machine with NVIDIA GPUs)."""
    found = builds.installed(cache_dir)
    if node.gpu:
        found.sort(key=lambda item: not item.build.variant.startswith("cuda"))
    refused = {v.build for v in buildverdicts.refusals(cache_dir, builds.LLAMACPP) if v.holds(node)}
    usable = [item for item in found if item.build.key not in refused]
    usable.sort(key=lambda item: not (item.check is not None and item.check.holds(node)))
    if not usable:
        what = "that was not refused here " if found else ""
        return CheckResult(
            False,
            f"no llama.cpp build {what}is installed in {cache_dir}",
            "run 'llmgw engine install', or pass --bin",
        )
    return usable[0].binary, usable[0].build.variant


def _python_program(
    engine: str, cache_dir: Path, configured: str, node: NodeConditions
) -> Path | CheckResult:
    if configured:
        return Path(configured)
    refused = {v.build for v in buildverdicts.refusals(cache_dir, engine) if v.holds(node)}
    found = [
        b
        for b in pythonbuilds.installed_python_builds(cache_dir)
        if b.build.engine == engine and b.build.key not in refused
    ]
    if not found:
        return CheckResult(
            False,
            f"no {engine} build {'that was not refused here ' if refused else ''}is installed in {cache_dir}",
            f"start a model on {engine} on this node (the agent installs it), or pass --bin",
        )
    return found[0].program


def _verdicts(cache_dir: Path, engine: str, node: NodeConditions) -> tuple[list[Verdict], list[Verdict]]:
    """The builds of ``engine`` accepted and refused on this machine as it is now."""
    checks = [b.check for b in builds.installed(cache_dir) if b.build.engine == engine]
    checks += [b.check for b in pythonbuilds.installed_python_builds(cache_dir) if b.build.engine == engine]
    accepted = [c for c in checks if c is not None and c.holds(node)]
    refused = [v for v in buildverdicts.refusals(cache_dir, engine) if v.holds(node)]
    return accepted, refused


async def _check_llamacpp(
    binary: Path, model: Path | None, node: NodeConditions, variant: str, timeout_s: float
) -> CheckResult:
    if model is not None:
        return await checking.check_llamacpp(
            binary, model, gpu=node.gpu, variant=variant, timeout_s=timeout_s
        )
    with tempfile.TemporaryDirectory(prefix="llmgw-engine-check-") as work:
        written = await asyncio.to_thread(checkmodel.write_check_model, Path(work))
        return await checking.check_llamacpp(
            binary, written, gpu=node.gpu, variant=variant, timeout_s=timeout_s
        )


def run_check(
    engine: str,
    binary: Path | None,
    model: Path | None,
    config: Path | None,
    cache_dir: Path,
    nvidia_smi: str,
    proc_version: Path,
    timeout_s: float,
    as_json: bool,
) -> None:
    """The check and the verdicts, printed; :class:`typer.Exit` (1) when the build does not compute."""
    if engine not in ENGINES:
        raise _fail(f"no engine {engine!r}", "name one of " + ", ".join(ENGINES))
    agent = load_agent_config(config) if config is not None else None
    cache = (cache_dir if agent is None else agent.cache_path).expanduser()
    report = asyncio.run(choose_source(nvidia_smi).read())
    try:
        kernel = parse_driver_version(proc_version.read_text(errors="replace"))
    except OSError:
        kernel = None
    driver = kernel or (report.driver_version if report else "")
    node = NodeConditions.of(driver, (d.name for d in devices_of(report)) if report else ())
    checked: Path | None = binary
    if engine == llamacpp.NAME:
        found = (binary, "") if binary is not None else _llamacpp_binary(cache, node)
        if isinstance(found, CheckResult):
            result = found
        else:
            checked, variant = found
            model = model or bundled_model()
            if not as_json:
                name = model.name if model else "llmgw's check model"
                console.print(f"checking {checked} with {name}{' on the GPU' if node.gpu else ''}…")
            result = asyncio.run(_check_llamacpp(checked, model, node, variant, timeout_s))
    elif engine == trtllm.NAME:
        configured = agent.engines.trtllm.python if agent is not None else ""
        checked = binary or (Path(configured) if configured else None)
        result = asyncio.run(checking.check_trtllm(checked, timeout_s))
    else:
        settings = getattr(agent.engines, engine) if agent is not None else None
        program = binary or _python_program(engine, cache, settings.program if settings else "", node)
        if isinstance(program, CheckResult):
            result = program
        else:
            checked = program
            result = asyncio.run(
                pythonchecks.check_python_build(program, engine, gpu=node.gpu, timeout_s=timeout_s)
            )
    accepted, refused = _verdicts(cache, engine, node)
    if as_json:
        document: dict[str, Any] = {
            "engine": engine,
            "build": str(checked) if checked else None,
            "node": str(node),
            "ok": result.ok,
            "found": result.found,
            "fix": result.fix,
            "accepted": [v.record() for v in accepted],
            "refused": [v.record() for v in refused],
        }
        typer.echo(json.dumps(document, indent=2))
        if not result.ok:
            raise typer.Exit(1)
        return
    for verdict in accepted:
        console.print(
            f"accepted at install: {engine} {verdict.build} on {verdict.checked_at}: {verdict.found}"
        )
    for verdict in refused:
        console.print(
            f"[yellow]refused[/] at install: {engine} {verdict.build} on {verdict.checked_at}: "
            f"{verdict.found}\n  [bold]fix:[/] {verdict.fix}"
        )
    if not result.ok:
        raise _fail(result.found, result.fix)
    console.print(f"[green]ok[/] {result.found}")
