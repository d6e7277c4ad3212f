"""``llmgw node add HOST``: make a machine a node of the cluster over SSH.

The steps are :mod:`llmgw.provisioning.nodes`'; this prints them as they run.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import typer

from llmgw.agent.config import MetricsSettings
from llmgw.cli.output import console
from llmgw.cli.sshoptions import (
    ACCEPT,
    CONFIG,
    HOST,
    IDENTITY,
    INSTALLED_DEPS,
    KNOWN_HOSTS,
    PORT,
    PYTHON,
    RELEASE,
    ROOT,
    TIMEOUT,
    USER,
    onboarding_reported,
    report_changed,
)
from llmgw.client.admin import AdminClient
from llmgw.client.paths import resolve_server_config
from llmgw.controlplane.config import load_server_config
from llmgw.provisioning.machines import machine_over_ssh
from llmgw.provisioning.nodes import add_node

app = typer.Typer(help="Nodes of the cluster: add one over SSH.", no_args_is_help=True)


@app.command("add")
def add(
    host: str = HOST,
    name: str = typer.Option("", "--name", help="The node's id (default: HOST)."),
    address: str = typer.Option(
        "", "--address", help="Where control planes reach its engines (default: HOST)."
    ),
    metrics_port: int = typer.Option(
        MetricsSettings().port, "--metrics-port", help="The agent's metrics port."
    ),
    user: str = USER,
    port: int = PORT,
    identity: Path = IDENTITY,
    known_hosts: Path = KNOWN_HOSTS,
    accept_host_key: bool = ACCEPT,
    release: str = RELEASE,
    python: str = PYTHON,
    installed_deps: bool = INSTALLED_DEPS,
    root: str = ROOT,
    timeout: float = TIMEOUT,
    config: Path = CONFIG,
) -> None:
    """Make HOST a node over SSH: a signed release, the engine user, certificate, agent.yaml, the agent."""
    path = resolve_server_config(config)
    loaded = load_server_config(path)
    admin = AdminClient.from_environment(config=path)
    machine = machine_over_ssh(
        host,
        user,
        port,
        identity,
        known_hosts,
        accept_host_key,
        release,
        python,
        installed_deps,
        root,
        timeout,
    )
    node_id = name or host
    console.print(f"adding node {node_id} on {user}@{host}:{port}")
    with tempfile.TemporaryDirectory(prefix="llmgw-node-add-") as scratch, onboarding_reported() as report:
        where = address or host
        changed = add_node(loaded, admin, machine, node_id, where, Path(scratch), report, metrics_port)
    report_changed(changed)
