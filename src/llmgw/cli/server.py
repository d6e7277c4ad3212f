"""``llmgw server``: create and run a control plane."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from llmgw.cli import sshoptions
from llmgw.cli.output import console, setup_logging
from llmgw.client.admin import AdminClient
from llmgw.client.paths import SYSTEM_DIR, resolve_server_config
from llmgw.controlplane.config import load_server_config
from llmgw.errors import ConfigError
from llmgw.provisioning import controlplanes
from llmgw.provisioning.clusters import (
    ADMIN_TOKEN_FILE,
    add_control_plane,
    certificate_warning,
    describe_pull,
    initialise,
    issue_node_certificate,
)
from llmgw.provisioning.machines import machine_over_ssh

app = typer.Typer(help="Create and run a control plane.", no_args_is_help=True)


@app.command()
def init(
    directory: Path = typer.Option(
        SYSTEM_DIR, "--dir", help="Directory for server.yaml, the CA, certificates and the token."
    ),
    name: str = typer.Option("cp1", help="This control plane's name."),
    http_host: str = typer.Option("127.0.0.1", help="Address of /v1, /api and /metrics."),
    http_port: int = typer.Option(8080, help="Port of /v1, /api and /metrics."),
    agent_host: str = typer.Option("127.0.0.1", help="Address agents connect to."),
    agent_port: int = typer.Option(8443, help="Port agents connect to."),
    store_url: str = typer.Option("", help="Store URL (default: SQLite in the directory)."),
) -> None:
    """Create a cluster: CA, certificate, admin token, server.yaml and the store."""
    config = initialise(
        directory,
        name=name,
        http_host=http_host,
        http_port=http_port,
        agent_host=agent_host,
        agent_port=agent_port,
        store_url=store_url,
    )
    console.print(f"created cluster in {directory}")
    console.print(f"  config:      {directory / 'server.yaml'}")
    console.print(f"  admin token: {directory / ADMIN_TOKEN_FILE}")
    console.print(f"  store:       {config.store_url}")
    console.print(f"start it with: llmgw server run --config {directory / 'server.yaml'}")


@app.command()
def run(
    config: Path = typer.Option(
        None, "--config", "-c", help="server.yaml (default: $LLMGW_CONFIG, the 'up' home, /etc/llmgw)."
    ),
    log_level: str = typer.Option("info", help="debug, info, warning or error."),
    log_json: bool = typer.Option(False, "--log-json", help="Log one JSON object per line."),
) -> None:
    """Run a control plane until SIGINT or SIGTERM."""
    setup_logging(log_level, log_json)
    loaded = load_server_config(resolve_server_config(config))
    from llmgw.agent.config import settings_problems
    from llmgw.controlplane.running import run_until_signalled

    logging_args = ["--log-level", log_level, *(["--log-json"] if log_json else [])]
    _run(run_until_signalled(loaded, settings_problems, logging_args))


@app.command(hidden=True)
def worker(
    config: Path = typer.Option(
        ..., "--config", "-c", help="The worker's server.yaml (its control plane writes it)."
    ),
    port: int = typer.Option(..., help="The HTTP port its control plane holds."),
    index: int = typer.Option(0, help="This worker's number."),
    log_level: str = typer.Option("info", help="debug, info, warning or error."),
    log_json: bool = typer.Option(False, "--log-json", help="Log one JSON object per line."),
) -> None:
    """Serve /v1 as one gateway worker of a control plane (started by 'llmgw server run')."""
    setup_logging(log_level, log_json)
    loaded = load_server_config(config)
    from llmgw.controlplane.serving.workerserving import run_worker

    _run(run_worker(loaded, port, index))


@app.command()
def add(
    host: str = typer.Argument("", help="A machine to set it up on over SSH (without: write --dir here)."),
    name: str = typer.Option(..., "--name", help="The new control plane's name (its certificate's name)."),
    directory: Path = typer.Option(None, "--dir", help="Directory for its server.yaml and certificates."),
    http_host: str = typer.Option("127.0.0.1", help="Address of its /v1, /api and /leader."),
    http_port: int = typer.Option(8080, help="Port of its /v1, /api and /leader."),
    agent_host: str = typer.Option("127.0.0.1", help="Address agents (and standbys) connect to."),
    agent_port: int = typer.Option(8443, help="Port agents (and standbys) connect to."),
    vip: str = typer.Option("", "--vip", help="Floating address keepalived keeps on the leader."),
    interface: str = typer.Option("eth0", help="Network interface for the floating address."),
    start: bool = typer.Option(False, "--start", help="Start it on this machine once written."),
    config: Path = typer.Option(None, "--config", "-c", help="server.yaml of an existing control plane."),
    user: str = sshoptions.USER,
    port: int = sshoptions.PORT,
    identity: Path = sshoptions.IDENTITY,
    known_hosts: Path = sshoptions.KNOWN_HOSTS,
    accept_host_key: bool = sshoptions.ACCEPT,
    release: str = sshoptions.RELEASE,
    python: str = sshoptions.PYTHON,
    installed_deps: bool = sshoptions.INSTALLED_DEPS,
    root: str = sshoptions.ROOT,
    timeout: float = sshoptions.TIMEOUT,
) -> None:
    """Add a control plane: certificate, configuration, store address (--vip for keepalived); over SSH
    with HOST: install a signed release there and start it (docs/operations.md, "Adding machines")."""
    path = resolve_server_config(config)
    existing = load_server_config(path)
    if host:
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
        console.print(f"adding control plane {name} on {user}@{host}:{port}")
        with sshoptions.onboarding_reported() as report:
            changed = controlplanes.add_over_ssh(
                existing,
                AdminClient.from_environment(config=path),
                machine,
                report,
                name=name,
                address=http_host if http_host != "127.0.0.1" else host,
                http_port=http_port,
                agent_port=agent_port,
                vip=vip,
                interface=interface,
            )
        sshoptions.report_changed(changed)
        return
    if directory is None:
        raise ConfigError("give --dir (where to write it here) or HOST (a machine to set it up on over SSH)")
    added = add_control_plane(
        existing,
        directory,
        name=name,
        http_host=http_host,
        http_port=http_port,
        agent_host=agent_host,
        agent_port=agent_port,
        vip=vip,
        interface=interface,
    )
    console.print(f"added control plane {added.name} in {directory}")
    console.print(f"  store: {added.store_url}")
    console.print(f"  mirror: {describe_pull(added.store_url, added.store.timeout_s)}")
    certificates = (
        (existing.name, existing.path(existing.tls.cert)),
        (added.name, directory / added.tls.cert),
    )
    for plane, certificate in certificates:
        if warning := certificate_warning(plane, certificate):
            console.print(f"  [yellow]warning:[/yellow] {warning}")
    if vip:
        console.print(f"  keepalived: {directory / 'keepalived.conf'} (copy to /etc/keepalived/)")
    command = ["llmgw", "server", "run", "--config", str(directory / "server.yaml")]
    if start:
        import subprocess
        import sys

        log = (directory / "server.log").open("ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "llmgw.cli.main", *command[1:]],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        console.print(f"started it (pid {process.pid}); its log: {directory / 'server.log'}")
    else:
        console.print(f"start it with: {' '.join(command)}")


@app.command("node-cert")
def node_cert(
    node_id: str = typer.Argument(..., help="The node's id (its certificate's common name)."),
    out: Path = typer.Option(..., "--out", help="Directory to write node.crt, node.key and ca.crt into."),
    config: Path = typer.Option(None, "--config", "-c", help="server.yaml of the cluster."),
) -> None:
    """Issue a node's agent certificate from the cluster's CA."""
    loaded = load_server_config(resolve_server_config(config))
    issue_node_certificate(loaded, node_id, out)
    console.print(f"wrote {out / 'node.crt'}, {out / 'node.key'} and {out / 'ca.crt'} for node {node_id}")


def _run(coroutine) -> None:  # type: ignore[no-untyped-def]
    try:
        import uvloop

        uvloop.run(coroutine)
    except ImportError:
        asyncio.run(coroutine)
