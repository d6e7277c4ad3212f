"""What the Do menu runs besides the admin API's calls: the operations the commands run, imported here once.

Adding a node or a control plane over SSH (what ``llmgw node add`` and
``llmgw server add HOST`` run), wiping this machine (``llmgw wipe``), adding a
preset (``llmgw ctl model add PRESET``) and a model from files on this machine
(``llmgw model serve``, ``llmgw ctl model add --definition``): the console
calls the functions those commands call, from the layers below both (the
client, provisioning, operations), never the commands themselves; every one
of them is imported in this module only, so where they live is said in one
place.

Each operation is first *prepared* from a dialog's inputs: the checks that
need no machine and no upload run then, so a wrong input is said in the
dialog, in the commands' words. The :class:`Prepared` it gives names what will
happen (the question asked before anything changes) and holds the run itself:
synchronous (the console runs it in a worker thread), it reports its progress
a line at a time and answers what it did, or raises :class:`LlmgwError` with
what to do.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw.agent.config import MetricsSettings
from llmgw.client.admin import AdminClient
from llmgw.client.definitions import definition, fill_checksums, read_definition
from llmgw.client.paths import resolve_server_config
from llmgw.client.presets import add_preset, preset_weights
from llmgw.controlplane.config import ServerConfig, load_server_config
from llmgw.core.presets import PRESETS, Preset, preset
from llmgw.errors import LlmgwError, ValidationFailed
from llmgw.operations.onboarding import Onboarding, Plan
from llmgw.operations.remote import SshShell
from llmgw.operations.steps import onboard
from llmgw.provisioning import machines
from llmgw.provisioning.controlplanes import server_plan
from llmgw.provisioning.machines import MIRROR, Machine, machine_over_ssh
from llmgw.provisioning.nodes import node_plan
from llmgw.provisioning.wipe import check_typed_name, run_wipe, wipe_plan

__all__ = [
    "NODE_METRICS_PORT",
    "PRESETS",
    "AdminClient",
    "Prepared",
    "Ssh",
    "add_from_files",
    "definition_file",
    "prepare_control_plane",
    "prepare_node",
    "prepare_preset",
    "prepare_wipe",
]

NODE_METRICS_PORT = MetricsSettings().port
"""``node add``'s default ``--metrics-port``."""

Report = Callable[[str], None]
"""Where a running operation says what it did last, one line at a time."""


@dataclass(frozen=True)
class Prepared:
    """An operation checked and ready: what it is, the question naming what it does, and the run."""

    title: str
    question: str
    run: Callable[[Report], str]
    """Runs it (blocking), reporting each step; answers what it did."""
    typed: Callable[[str], None] | None = None
    """What must be typed at the question before it runs (wipe: the machine's name), checked;
    None: yes or no is enough."""


@dataclass(frozen=True)
class Ssh:
    """How to reach the machine and what to install on it: the options ``node add`` and ``server add``
    share, their defaults the commands' (:mod:`llmgw.provisioning.machines`)."""

    user: str = machines.SSH_USER
    port: int = machines.SSH_PORT
    identity: str = ""
    known_hosts: str = ""
    accept_host_key: bool = machines.ACCEPT_HOST_KEY
    release: str = machines.RELEASE
    python: str = machines.PYTHON
    installed_deps: bool = machines.INSTALLED_DEPS
    root: str = machines.ROOT
    timeout_s: float = machines.JOIN_TIMEOUT_S

    def machine(self, host: str) -> Machine:
        if not host:
            raise ValidationFailed(
                [("HOST", "required: the machine's address (what ssh connects to)")],
                "type the machine's address or name",
            )
        return machine_over_ssh(
            host,
            self.user,
            self.port,
            Path(self.identity).expanduser() if self.identity else None,
            Path(self.known_hosts).expanduser() if self.known_hosts else None,
            self.accept_host_key,
            self.release,
            self.python,
            self.installed_deps,
            self.root,
            self.timeout_s,
        )

    def target(self, host: str) -> str:
        release = self.release if self.release and self.release != MIRROR else "the mirror's newest"
        return f"{self.user}@{host}:{self.port}, the release {release}"


def cluster_of(config: str) -> tuple[ServerConfig, AdminClient]:
    """The cluster's server.yaml (``config``; empty: found as the commands find it) and its admin API."""
    path = resolve_server_config(Path(config).expanduser() if config else None)
    return load_server_config(path), AdminClient.from_environment(config=path)


def _onboarding(
    machine: Machine, make_plan: Callable[[Path], Plan], prefix: str, first: str
) -> tuple[Plan, Callable[[Report], str]]:
    """The command's plan, made now (its checks of the cluster, the names and the release said before
    anything is asked), and the run of the onboarding steps as the command runs them, each reported."""
    scratch = tempfile.TemporaryDirectory(prefix=prefix)
    try:
        plan = make_plan(Path(scratch.name))
    except BaseException:
        scratch.cleanup()
        raise

    def run(report: Report) -> str:
        def step(name: str, text: str) -> None:
            report(f"{name:<12} {text}")

        report(first)
        ctx = Onboarding(
            SshShell(machine.target),
            step,
            machine.layout,
            machine.installer,
            join_timeout_s=machine.timeout_s,
        )
        try:
            changed = onboard(ctx, plan)
        finally:
            scratch.cleanup()
        return "done: " + (
            ", ".join(changed) + " changed" if changed else "nothing changed (all steps as they were)"
        )

    return plan, run


def prepare_node(
    config: str, host: str, ssh: Ssh, *, name: str = "", address: str = "", metrics_port: int
) -> Prepared:
    """``llmgw node add HOST``."""
    machine = ssh.machine(host)
    loaded, admin = cluster_of(config)
    node_id = name or host
    plan, run = _onboarding(
        machine,
        lambda scratch: node_plan(loaded, admin, machine, node_id, address or host, scratch, metrics_port),
        "llmgw-node-add-",
        f"adding node {node_id} on {ssh.user}@{host}:{ssh.port}",
    )
    question = (
        f"Make {host} node {node_id} of {loaded.name}'s cluster over SSH ({ssh.target(host)})? It installs "
        f"llmgw {plan.release.version} there, the engine user, a certificate, agent.yaml and the "
        f"llmgw-agent service, then waits up to {ssh.timeout_s:g} s for the node to register."
    )
    return Prepared(f"Add node {node_id}", question, run)


def prepare_control_plane(
    config: str,
    host: str,
    ssh: Ssh,
    *,
    name: str,
    address: str = "",
    http_port: int,
    agent_port: int,
    vip: str = "",
    interface: str = "eth0",
) -> Prepared:
    """``llmgw server add HOST``, ``vip`` the floating address keepalived keeps on the leader."""
    if not name:
        raise ValidationFailed(
            [("--name", "required: the new control plane's name (its certificate's name)")],
            "type a name of its own, e.g. cp2",
        )
    machine = ssh.machine(host)
    loaded, admin = cluster_of(config)
    where = address or host
    plan, run = _onboarding(
        machine,
        lambda scratch: server_plan(
            loaded,
            admin,
            machine,
            name=name,
            address=where,
            http_port=http_port,
            agent_port=agent_port,
            vip=vip,
            interface=interface,
            scratch=scratch,
        ),
        "llmgw-server-add-",
        f"adding control plane {name} on {ssh.user}@{host}:{ssh.port}",
    )
    floating = f" keepalived's configuration keeping {vip} (on {interface}) on the leader," if vip else ""
    question = (
        f"Make {host} control plane {name} of {loaded.name}'s cluster over SSH ({ssh.target(host)})? It "
        f"installs llmgw {plan.release.version} there, a certificate, server.yaml (the cluster's store, "
        f"/v1 and /api on {where}:{http_port}, agents on {where}:{agent_port}),{floating} the "
        f"llmgw-server service, then waits up to {ssh.timeout_s:g} s for the cluster to list it."
    )
    return Prepared(f"Add control plane {name}", question, run)


def prepare_wipe(root: str, *, models: bool, store: bool) -> Prepared:
    """``llmgw wipe``: the question lists everything that goes; the machine's name must be typed."""
    planned = wipe_plan(Path(root or "/").expanduser(), models=models, store=store)
    if not planned.items:
        raise LlmgwError(f"{planned.machine}: nothing of llmgw is here", "nothing to wipe")
    lines = [f"  {i.kind:<14} {i.what}" + (f"  ({i.detail})" if i.detail else "") for i in planned.items]
    question = (
        f"Wipe llmgw from {planned.machine}? These go:\n"
        + "\n".join(lines)
        + f"\n\nType this machine's name ({planned.machine}) to wipe llmgw from it."
    )

    def run(report: Report) -> str:
        outcomes = run_wipe(planned)
        for outcome in outcomes:
            report(f"{outcome.item.kind:<14} {outcome.item.what}: {outcome.result}")
        return f"wiped llmgw from {planned.machine}: {len(outcomes)} items removed"

    def typed(text: str) -> None:
        check_typed_name(text, planned.machine)

    return Prepared(f"Wipe {planned.machine}", question, run, typed)


def prepare_preset(admin: AdminClient, name: str, weights: str = "") -> Prepared:
    """``llmgw ctl model add PRESET [--weights SHA256]``."""
    chosen: Preset = preset(name)
    if weights:
        what = f"its weights the mirror's {weights[:12]}…"
        path = None
    else:
        path = preset_weights(chosen)  # the package carrying them, or what to install
        size = path.stat().st_size >> 20
        what = f"uploading {path.name} ({size} MiB, from {chosen.package}) into the mirror"
    question = f"Add model {chosen.name} ({chosen.description}), {what}?"

    def run(report: Report) -> str:
        if path is not None:
            report(f"uploading {path.name} into the mirror…")
        added = add_preset(admin, chosen, weights or None)
        report(f"added the definition of {added.name}")
        return f"added model {added.name}: 'llmgw ctl replicas' (or the replicas view) shows it starting"

    return Prepared(f"Add preset {chosen.name}", question, run)


def definition_file(path: str, name: str) -> dict[str, Any]:
    """``llmgw ctl model add --definition FILE [NAME]``: the definition the file holds."""
    return read_definition(Path(path).expanduser(), name or None)


def add_from_files(
    admin: AdminClient,
    path: str,
    *,
    name: str,
    engine: str,
    projector: str,
    profile: dict[str, Any],
    replicas: dict[str, int],
) -> tuple[dict[str, Any], Callable[[], None]]:
    """``llmgw model serve PATH [--projector FILE]``: the definition, checked before anything is
    uploaded, and the upload that fills in its files' checksums (blocking)."""
    data, uploads = definition(
        Path(path).expanduser(),
        name=name or None,
        fmt=None,
        engine=engine or None,
        projector=Path(projector).expanduser() if projector else None,
        profile=profile,
        replicas=replicas,
        on_demand=False,
    )
    return data, lambda: fill_checksums(data, uploads, admin)
