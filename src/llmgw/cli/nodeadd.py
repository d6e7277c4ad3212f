"""``llmgw node add HOST``: make a machine a node of the cluster over SSH.

The command runs on a control plane's machine (it needs server.yaml, the CA
and the admin token): it checks the release here, then runs the onboarding
steps (:mod:`llmgw.operations.steps`) on the machine and waits until the
node registers.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import typer
import yaml
from packaging.version import InvalidVersion, Version

from llmgw.agent.config import AgentConfig, MetricsSettings
from llmgw.cli.adminclient import AdminClient
from llmgw.cli.output import console
from llmgw.cli.server import issue_node_certificate, resolve_config
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
)
from llmgw.controlplane.config import ServerConfig, load_server_config
from llmgw.errors import ConfigError, LlmgwError, UntrustedRelease
from llmgw.mirror.releases import SIGNATURE, SUMS, Release, fetch_release, read_trusted_key, verify_release
from llmgw.operations import certificates
from llmgw.operations.onboarding import Installer, Layout, Onboarding, Plan, ReleaseFiles, Service, StepFailed
from llmgw.operations.remote import SshShell, Target
from llmgw.operations.steps import onboard

app = typer.Typer(help="Nodes of the cluster: add one over SSH.", no_args_is_help=True)


@dataclass(frozen=True)
class Machine:
    """The SSH and install options every ``add`` shares."""

    target: Target
    layout: Layout
    installer: Installer
    release: str
    timeout_s: float


def machine_options(
    host: str,
    user: str,
    port: int,
    identity: Path | None,
    known_hosts: Path | None,
    accept_host_key: bool,
    release: str,
    python: str,
    installed_deps: bool,
    root: str,
    timeout_s: float,
) -> Machine:
    target = Target(host, user, port, identity, known_hosts, accept_host_key)
    return Machine(target, Layout(PurePosixPath(root)), Installer(python, installed_deps), release, timeout_s)


def release_files(config: ServerConfig, source: str, scratch: Path) -> ReleaseFiles:
    """The release at ``source`` (directory, address, or ``mirror``), verified here with the cluster's
    trusted.pub."""
    trusted = read_trusted_key(config.path(config.release.trusted_pub))
    if not source or source == MIRROR:
        kept = mirrored_releases(config)
        if not kept:
            raise StepFailed(
                "this machine",
                "install",
                "no release given, and this control plane's mirror holds none",
                "give --release with a signed release's directory or https address "
                "('make release KEY=...' makes one), or import an offline bundle ('llmgw bundle import')",
            )
        source = str(kept[-1])
    try:
        if source.startswith(("http://", "https://")):
            release: Release = asyncio.run(fetch_release(source, scratch, trusted))
        else:
            release = verify_release(Path(source), trusted)
    except (UntrustedRelease, ConfigError) as error:
        raise StepFailed("this machine", "install", error.message, error.hint) from error
    directory = release.wheel.parent
    files = {name: (directory / name).read_bytes() for name in (release.wheel.name, SUMS, SIGNATURE)}
    return ReleaseFiles(release.version, release.wheel.name, release.sha256, files, trusted)


MIRROR = "mirror"
"""``--release mirror``: the newest release held in this control plane's mirror."""


def mirrored_releases(config: ServerConfig) -> list[Path]:
    """The release folders an offline bundle put into this control plane's mirror, oldest version first."""
    root = config.data_path / "mirror" / "releases"
    found = [folder for folder in root.iterdir() if (folder / SUMS).is_file()] if root.is_dir() else []

    def version(folder: Path) -> Version:
        try:
            return Version(folder.name)
        except InvalidVersion:
            return Version("0")

    return sorted(found, key=version)


def control_plane_addresses(config: ServerConfig, admin: AdminClient) -> list[str]:
    """Every control plane's agent address the cluster knows, this one's first."""
    own = f"{config.agent_server.host}:{config.agent_server.port}"
    others = [plane.agents for plane in admin.status().control_planes if plane.agents]
    return list(dict.fromkeys([own, *others]))


def node_plan(
    config: ServerConfig,
    admin: AdminClient,
    machine: Machine,
    node_id: str,
    address: str,
    scratch: Path,
    metrics_port: int = MetricsSettings().port,
) -> Plan:
    layout = machine.layout
    agent = AgentConfig(
        node_id=node_id,
        address=address,
        metrics=MetricsSettings(port=metrics_port),
        control_planes=control_plane_addresses(config, admin),
        work_dir=str(layout.state_dir / "work"),
        cache_dir=str(layout.state_dir / "cache"),
    )
    agent_yaml = yaml.safe_dump(agent.model_dump(mode="json"), sort_keys=False).encode()
    ca_pem = config.path(config.tls.ca).read_bytes()

    def issue() -> dict[str, tuple[bytes, int]]:
        out = scratch / "certificate"
        issue_node_certificate(config, node_id, out)
        return {
            "ca.crt": (ca_pem, 0o644),
            "node.key": ((out / "node.key").read_bytes(), 0o600),
            "node.crt": ((out / "node.crt").read_bytes(), 0o644),
        }

    def joined() -> bool:
        return any(node.id == node_id and node.connected for node in admin.nodes())

    return Plan(
        release=release_files(config, machine.release, scratch / "release"),
        files={"ca.crt": (ca_pem, 0o644), "agent.yaml": (agent_yaml, 0o600)},
        certificate="node.crt",
        certificate_fits=lambda pem: (
            not certificates.problems(pem, ca_pem, name=node_id, usage="client", sans=[node_id])
        ),
        issue=issue,
        service=Service(
            "llmgw-agent",
            ("agent", "run", "--config", str(layout.config_dir / "agent.yaml"), "--keep-engines"),
            "llmgw node agent",
        ),
        joined=joined,
        joined_what=f"node {node_id} registered with the control plane",
    )


def run_onboarding(machine: Machine, plan_of: Callable[[], Plan]) -> None:
    """Run the steps, printing each; a failed step ends the command with its message and hint."""

    def report(step: str, text: str) -> None:
        console.print(f"  {step:<12} {text}", markup=False, highlight=False)

    shell = SshShell(machine.target)
    ctx = Onboarding(shell, report, machine.layout, machine.installer, join_timeout_s=machine.timeout_s)
    try:
        changed = onboard(ctx, plan_of())
    except LlmgwError as error:
        console.print(f"error: {error.message}", markup=False, highlight=False)
        if error.hint:
            console.print(f"  what to do: {error.hint}", markup=False, highlight=False)
        raise typer.Exit(1) from None
    console.print(
        f"done: {', '.join(changed) + ' changed' if changed else 'nothing changed (all steps as they were)'}"
    )


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
    path = resolve_config(config)
    loaded = load_server_config(path)
    admin = AdminClient.from_environment(config=path)
    machine = machine_options(
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
    with tempfile.TemporaryDirectory(prefix="llmgw-node-add-") as scratch:
        run_onboarding(
            machine,
            lambda: node_plan(loaded, admin, machine, node_id, address or host, Path(scratch), metrics_port),
        )
