"""A machine made another control plane of the cluster over SSH (``llmgw server add HOST``).

The same steps as ``node add`` (:mod:`llmgw.provisioning.nodes`), with what a
control plane needs instead of the agent's: before anything changes, a check
that the machine has room for the mirror's blobs it will hold (their sizes
from the mirror API); a certificate for server and client use covering its
addresses (an older one without client use or an address is reissued);
server.yaml with the store's address, the CA and the admin token; the
``llmgw-server`` service; then a wait until the cluster lists it
(``/api/status``), which also proves it reached the store.

The store lets it in as far as llmgw controls that: the new control plane
uses the store address (role and password) of server.yaml. PostgreSQL's
``pg_hba.conf`` (or Patroni's ``postgresql.pg_hba``) belongs to the
database's operator: when the new one cannot log in, the join step's error
says which line it needs.
"""

from __future__ import annotations

import tempfile
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from llmgw.client.admin import AdminClient
from llmgw.controlplane.config import ServerConfig, save_server_config
from llmgw.operations import certificates
from llmgw.operations.onboarding import Onboarding, Plan, Report, Service
from llmgw.operations.steps import room_check
from llmgw.protocol.grpc_transport import SERVER_NAME
from llmgw.provisioning.clusters import add_control_plane
from llmgw.provisioning.machines import Machine, release_files, run_onboarding

SERVER_FILES = ("server.yaml", "ca.crt", "ca.key", "admin.token", "store-secrets.key", "keepalived.conf")


def pg_hba_hint(config: ServerConfig, address: str) -> str:
    parts = urlsplit(config.store_url.replace("+asyncpg", ""))
    database = parts.path.lstrip("/") or "llmgw"
    user = parts.username or "llmgw"
    return (
        f"if its log says the store refused it, let it in where PostgreSQL is run: 'host {database} {user} "
        f"{address}/32 scram-sha-256' in pg_hba.conf (with Patroni: under postgresql.pg_hba, "
        "'patronictl edit-config'), then run again"
    )


def server_plan(
    config: ServerConfig,
    admin: AdminClient,
    machine: Machine,
    *,
    name: str,
    address: str,
    http_port: int,
    agent_port: int,
    vip: str,
    interface: str,
    scratch: Path,
) -> Plan:
    layout = machine.layout
    written = scratch / "server"
    added = add_control_plane(
        config,
        written,
        name=name,
        http_host=address,
        http_port=http_port,
        agent_host=address,
        agent_port=agent_port,
        vip=vip,
        interface=interface,
    )
    added.data_dir = str(layout.state_dir)
    save_server_config(added, written / "server.yaml")
    ca_pem = (written / "ca.crt").read_bytes()
    hosts = sorted({SERVER_NAME, "localhost", "127.0.0.1", address, *([vip.split("/")[0]] if vip else [])})
    modes = {"server.yaml": 0o600, "ca.key": 0o600, "admin.token": 0o600, "store-secrets.key": 0o600}
    files = {
        file: ((written / file).read_bytes(), modes.get(file, 0o644))
        for file in SERVER_FILES
        if (written / file).exists()
    }
    mirror_bytes = sum(blob.size for blob in admin.blobs())

    def joined() -> bool:
        return any(plane.name == name for plane in admin.status().control_planes)

    return Plan(
        release=release_files(config, machine.release, scratch / "release"),
        files=files,
        certificate="server.crt",
        certificate_fits=lambda pem: (
            not certificates.problems(pem, ca_pem, name=name, usage="both", sans=hosts)
        ),
        issue=lambda: {
            "server.crt": ((written / "server.crt").read_bytes(), 0o644),
            "server.key": ((written / "server.key").read_bytes(), 0o600),
        },
        service=Service(
            "llmgw-server",
            ("server", "run", "--config", str(layout.config_dir / "server.yaml")),
            "llmgw control plane",
        ),
        joined=joined,
        joined_what=f"control plane {name} listed by the cluster (it reached the store)",
        engine_user=False,
        checks=(("mirror", room_check("mirror", _state_dir, mirror_bytes, "the mirror's blobs")),),
        join_hint=pg_hba_hint(config, address),
    )


def _state_dir(ctx: Onboarding) -> PurePosixPath:
    return ctx.layout.state_dir


def add_over_ssh(
    config: ServerConfig,
    admin: AdminClient,
    machine: Machine,
    report: Report,
    *,
    name: str,
    address: str,
    http_port: int,
    agent_port: int,
    vip: str,
    interface: str,
) -> list[str]:
    """Run ``server add HOST``'s steps, telling each to ``report``: the names of what changed.

    A failed step raises its :class:`~llmgw.errors.LlmgwError` (which step, what to do)."""
    with tempfile.TemporaryDirectory(prefix="llmgw-server-add-") as scratch:
        return run_onboarding(
            machine,
            lambda: server_plan(
                config,
                admin,
                machine,
                name=name,
                address=address,
                http_port=http_port,
                agent_port=agent_port,
                vip=vip,
                interface=interface,
                scratch=Path(scratch),
            ),
            report,
        )
