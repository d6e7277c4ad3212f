"""A machine made a node of the cluster over SSH (``llmgw node add HOST``).

It runs on a control plane's machine (it needs server.yaml, the CA and the
admin token): the release is checked here, then the onboarding steps
(:mod:`llmgw.operations.steps`) run on the machine, and it waits until the
node registers with the control plane.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from llmgw.agent.config import AgentConfig, MetricsSettings
from llmgw.client.admin import AdminClient
from llmgw.controlplane.config import ServerConfig
from llmgw.operations import certificates
from llmgw.operations.onboarding import Plan, Report, Service
from llmgw.provisioning.clusters import issue_node_certificate
from llmgw.provisioning.machines import Machine, release_files, run_onboarding


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


def add_node(
    config: ServerConfig,
    admin: AdminClient,
    machine: Machine,
    node_id: str,
    address: str,
    scratch: Path,
    report: Report,
    metrics_port: int = MetricsSettings().port,
) -> list[str]:
    """Make ``machine`` the node ``node_id`` (engines reached at ``address``): the names of what changed."""
    return run_onboarding(
        machine, lambda: node_plan(config, admin, machine, node_id, address, scratch, metrics_port), report
    )
