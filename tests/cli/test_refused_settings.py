"""Settings a node's agent could not start on show in /api/nodes, /api/status, ctl status and ctl nodes."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from llmgw.adminapi.schemas import NodeView, StatusView
from llmgw.cli.main import app
from llmgw.core.devices import NodeInventory
from llmgw.core.nodes import NodeRegistration, SettingsRefusal
from llmgw.protocol.channels import memory_pair
from llmgw.protocol.links import control_link

from .conftest import AdminServer

REASON = "FileNotFoundError: [Errno 2] No such file or directory: '/proc/llmgw'"


def run(server: AdminServer, *args: str) -> str:
    answer = CliRunner().invoke(app, [*args, *server.options()], env={"COLUMNS": "300"})
    assert answer.exit_code == 0, answer.output
    return answer.stdout


def register(server: AdminServer, node_id: str, refusal: SettingsRefusal | None) -> None:
    inventory = NodeInventory(node_id=node_id, address="127.0.0.1", cpu_cores=2, memory_mb=2048)
    server.fleet.attach(
        NodeRegistration(inventory=inventory, refused_settings=refusal), control_link(memory_pair()[1])
    )


def test_a_refusal_shows_per_node_in_the_api_and_in_ctl(admin_server: AdminServer) -> None:
    register(admin_server, "node1", SettingsRefusal("work_dir: /proc/llmgw\n", REASON, 1_700_000_000.0))
    register(admin_server, "node2", None)
    status = StatusView.model_validate_json(run(admin_server, "status", "--json"))
    assert list(status.refused_settings) == ["node1"]
    assert status.refused_settings["node1"].keys == "work_dir=/proc/llmgw"
    assert status.refused_settings["node1"].reason == REASON
    nodes = [NodeView.model_validate(n) for n in json.loads(run(admin_server, "ctl", "nodes", "--json"))]
    assert [(n.id, n.refused_settings is not None) for n in nodes] == [("node1", True), ("node2", False)]
    shown = run(admin_server, "ctl", "status")
    assert (
        "refused settings on node1" in shown and "work_dir=/proc/llmgw" in shown and "/proc/llmgw'" in shown
    )
    assert "node2" not in shown
    listed = run(admin_server, "ctl", "nodes")
    assert "REFUSED SETTINGS" in listed and "work_dir=/proc/llmgw: FileNotFoundError" in listed


def test_a_node_that_registers_again_without_a_refusal_shows_none(admin_server: AdminServer) -> None:
    register(admin_server, "node1", SettingsRefusal("work_dir: /proc/llmgw\n", REASON))
    register(admin_server, "node1", None)
    status = StatusView.model_validate_json(run(admin_server, "status", "--json"))
    assert status.refused_settings == {}
