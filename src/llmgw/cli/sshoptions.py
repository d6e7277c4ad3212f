"""What ``node add`` and ``server add`` share: the options saying how to reach the machine and what to
install (their defaults from :mod:`llmgw.provisioning.machines`), and how their steps are printed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer

from llmgw.cli.output import console
from llmgw.errors import LlmgwError
from llmgw.operations.onboarding import Report
from llmgw.provisioning import machines

HOST = typer.Argument(..., help="The machine's address (what ssh connects to).")
USER = typer.Option(
    machines.SSH_USER, "--user", help="The SSH user (root: onboarding creates users and services)."
)
PORT = typer.Option(machines.SSH_PORT, "--port", help="The SSH port.")
IDENTITY = typer.Option(
    None, "--identity", help="Private key to log in with (default: ssh's own and its agent's)."
)
KNOWN_HOSTS = typer.Option(None, "--known-hosts", help="known_hosts file (default: ~/.ssh/known_hosts).")
ACCEPT = typer.Option(
    machines.ACCEPT_HOST_KEY,
    "--accept-host-key",
    help="Record the host key of a machine not yet in known_hosts.",
)
RELEASE = typer.Option(
    machines.RELEASE,
    "--release",
    help="A signed release: its directory, its https address, or 'mirror' (the newest one an offline "
    "bundle put into this control plane's mirror; the default when one is there).",
)
PYTHON = typer.Option(machines.PYTHON, "--python", help="The Python on the machine that makes llmgw's venv.")
INSTALLED_DEPS = typer.Option(
    machines.INSTALLED_DEPS,
    "--installed-deps",
    help="Take the dependencies from --python's environment (pip --no-deps) instead of the index.",
)
ROOT = typer.Option(
    machines.ROOT, "--root", hidden=True, help="Where /opt, /etc and /var/lib are on the machine (tests)."
)
TIMEOUT = typer.Option(machines.JOIN_TIMEOUT_S, "--timeout", help="Seconds to wait for the machine to join.")
CONFIG = typer.Option(None, "--config", "-c", help="server.yaml of the cluster.")


@contextmanager
def onboarding_reported() -> Iterator[Report]:
    """Each step printed as it runs; a failed step printed with what to do, ending the command (status 1)."""

    def report(step: str, text: str) -> None:
        console.print(f"  {step:<12} {text}", markup=False, highlight=False)

    try:
        yield report
    except LlmgwError as error:
        console.print(f"error: {error.message}", markup=False, highlight=False)
        if error.hint:
            console.print(f"  what to do: {error.hint}", markup=False, highlight=False)
        raise typer.Exit(1) from None


def report_changed(changed: list[str]) -> None:
    console.print(
        f"done: {', '.join(changed) + ' changed' if changed else 'nothing changed (all steps as they were)'}"
    )
