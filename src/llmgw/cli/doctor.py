"""``llmgw doctor``: what stops this node from serving, and how to fix it."""

from __future__ import annotations

import asyncio
import json
import shutil
from dataclasses import asdict
from pathlib import Path

import typer

from llmgw.agent.diagnosis import NodeFacts, diagnose, serving_blocked
from llmgw.agent.discovery import choose_source, parse_driver_version
from llmgw.cli.output import console, table
from llmgw.engines import builds, buildverdicts, pythonbuilds

DEFAULT_CACHE = Path("~/.cache/llmgw")

_MARKS = {"error": "[bold red]error[/]", "warning": "[yellow]warning[/]", "ok": "[green]ok[/]"}


def gather(nvidia_smi: str, cache_dir: Path, proc_version: Path) -> NodeFacts:
    """Read what the doctor needs from this machine."""
    try:
        kernel_text = proc_version.read_text(errors="replace")
    except OSError:
        kernel_text = ""
    report = asyncio.run(choose_source(nvidia_smi).read())
    cache = cache_dir.expanduser()
    return NodeFacts(
        report=report,
        kernel_driver=parse_driver_version(kernel_text) if kernel_text else None,
        nvidia_smi_found=shutil.which(nvidia_smi) is not None,
        installed_builds=tuple(builds.installed(cache)),
        python_builds=tuple(pythonbuilds.installed_python_builds(cache)),
        refusals=tuple(buildverdicts.refusals(cache)),
    )


def doctor(
    nvidia_smi: str = typer.Option(
        "nvidia-smi", help="nvidia-smi to read the cards with, when NVML is not there or a path is given."
    ),
    cache_dir: Path = typer.Option(
        DEFAULT_CACHE, envvar="LLMGW_CACHE", help="Where engine builds are installed."
    ),
    proc_version: Path = typer.Option(
        Path("/proc/driver/nvidia/version"), help="The NVIDIA kernel module's version file.", hidden=True
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the findings as JSON."),
) -> None:
    """Report what stops this node from serving (driver, cards, MIG states, engine builds), each with its fix.

    Engine builds: the one each engine uses and the check it passed here, and every build refused here
    (it failed its check) with what the check saw and the fix.

    Exits with status 1 when something stops the node or one of its cards from serving.
    """
    findings = diagnose(gather(nvidia_smi, cache_dir, proc_version))
    if as_json:
        typer.echo(json.dumps([asdict(f) for f in findings], indent=2))
    else:
        table(
            ("", "what", "found", "fix"),
            ((_MARKS[f.severity], f.subject, f.problem, f.fix) for f in findings),
        )
        if serving_blocked(findings):
            console.print("[bold red]This node cannot serve everything it has until the errors are fixed.[/]")
    if serving_blocked(findings):
        raise typer.Exit(1)
