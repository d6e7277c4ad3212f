"""``ctl model add --provider`` reads the key from a file or a variable; ``model show`` says "key: set"."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from llmgw.cli.main import app

from .conftest import AdminServer

SECRET = "sk-cli-provider-secret"


def invoke(server: AdminServer, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    answer = CliRunner().invoke(app, [*args, *server.options()], env={"COLUMNS": "200", **(env or {})})
    failure = answer.exception
    problems = getattr(failure, "problems", None)
    return answer.exit_code, answer.output + (f"{failure} {problems}" if failure else "")


def test_a_provider_model_added_with_a_key_file_shows_key_set(
    admin_server: AdminServer, tmp_path: Path
) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(SECRET + "\n")
    code, out = invoke(admin_server, "ctl", "model", "add", "hosted", "--provider", "https://api.example.com/v1",
                       "--provider-model", "gpt-4o", "--key-file", str(key_file))  # fmt: skip
    assert code == 0, out
    code, shown = invoke(admin_server, "ctl", "model", "show", "hosted")
    assert code == 0, shown
    assert "key: set" in shown and "openai at https://api.example.com/v1, model gpt-4o" in shown
    code, as_json = invoke(admin_server, "ctl", "model", "show", "hosted", "--json")
    assert json.loads(as_json)["definition"]["provider"]["key"] == "set"
    code, listed = invoke(admin_server, "ctl", "models")
    assert "openai gpt-4o at api.example.com" in listed
    assert SECRET not in out + shown + as_json + listed


def test_a_definition_file_names_the_key_variable(admin_server: AdminServer, tmp_path: Path) -> None:
    definition = tmp_path / "hosted.yaml"
    provider = {"api": "anthropic", "base_url": "https://api.example.com", "model": "claude-x"}
    definition.write_text(
        yaml.safe_dump({"name": "claude", "provider": {**provider, "key_env": "HOSTED_KEY"}})
    )
    code, out = invoke(admin_server, "ctl", "model", "add", "-f", str(definition), env={"HOSTED_KEY": SECRET})
    assert code == 0, out
    code, shown = invoke(admin_server, "ctl", "model", "show", "claude")
    assert "key: set" in shown and "anthropic at https://api.example.com" in shown


def test_a_key_written_in_the_definition_file_is_refused(admin_server: AdminServer, tmp_path: Path) -> None:
    definition = tmp_path / "hosted.yaml"
    definition.write_text(yaml.safe_dump({"name": "x", "provider": {
        "base_url": "https://api.example.com/v1", "model": "m", "key": SECRET}}))  # fmt: skip
    code, out = invoke(admin_server, "ctl", "model", "add", "-f", str(definition))
    assert code != 0
    assert "key_file" in out and "key_env" in out


def test_an_unset_key_variable_says_what_to_export(admin_server: AdminServer) -> None:
    code, out = invoke(admin_server, "ctl", "model", "add", "hosted", "--provider", "https://api.example.com/v1",
                       "--key-env", "LLMGW_TEST_NO_SUCH_VARIABLE")  # fmt: skip
    assert code != 0
    assert "export LLMGW_TEST_NO_SUCH_VARIABLE" in out
