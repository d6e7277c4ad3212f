"""``llmgw ctl config set``: only settings llmgw reads, each with a value of its type."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.errors import ValidationFailed

from .conftest import AdminServer


def config(server: AdminServer, *args: str) -> str:
    answer = CliRunner().invoke(app, ["ctl", "config", *args, *server.options()], env={"COLUMNS": "300"})
    assert answer.exit_code == 0, answer.output
    return answer.output


def refusal(server: AdminServer, *args: str) -> str:
    """What ``llmgw`` prints of the refusal (its message, each problem, its hint)."""
    answer = CliRunner().invoke(app, ["ctl", "config", *args, *server.options()], env={"COLUMNS": "300"})
    error = answer.exception
    assert isinstance(error, ValidationFailed), answer.output
    assert error.status == 400
    return " ".join([error.message, *(f"{field}: {why}" for field, why in error.problems), error.hint])


def test_a_key_llmgw_does_not_read_is_refused_with_the_keys_it_reads(admin_server: AdminServer) -> None:
    shown = refusal(admin_server, "set", "gateway.request_wait_s", "abc")
    assert "gateway.request_wait_s is not a setting llmgw reads" in shown
    assert "serving.stopped" in shown and "agents.nodes.<node id>" in shown
    assert json.loads(config(admin_server, "list", "--json")) == {}


def test_a_misspelt_key_is_answered_with_the_closest_one(admin_server: AdminServer) -> None:
    shown = refusal(admin_server, "set", "firewall.enable", "false")
    assert "did you mean firewall.enabled" in shown


def test_a_value_of_the_wrong_type_is_refused_naming_the_type(admin_server: AdminServer) -> None:
    shown = refusal(admin_server, "set", "firewall.enabled", "abc")
    assert "firewall.enabled takes a JSON bool" in shown and "not a string" in shown
    assert json.loads(config(admin_server, "list", "--json")) == {}


def test_a_valid_setting_is_kept(admin_server: AdminServer) -> None:
    config(admin_server, "set", "knowledge.embedding_model", "minilm")
    assert json.loads(config(admin_server, "list", "--json")) == {"knowledge.embedding_model": "minilm"}
