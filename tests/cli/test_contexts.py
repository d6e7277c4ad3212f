"""The client config's contexts: where it lives, 0600, ``ctl context``, and which target wins."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.client.config import load_client_config
from llmgw.client.paths import client_config_path
from llmgw.client.targets import resolve_target
from llmgw.errors import ConfigError, ValidationFailed

from .conftest import AdminServer


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """An environment whose config and data directories are empty ones of the test's own."""
    return {
        "HOME": str(tmp_path / "home"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
    }


def ctl(environ: dict[str, str], *args: str) -> str:
    unset: dict[str, str | None] = {"LLMGW_URL": None, "LLMGW_ADMIN_TOKEN": None, "LLMGW_CLIENT_CONFIG": None}
    answer = CliRunner().invoke(app, ["ctl", *args], env={**unset, **environ, "COLUMNS": "200"})
    if answer.exception is not None and not isinstance(answer.exception, SystemExit):
        raise answer.exception
    assert answer.exit_code == 0, answer.output
    return answer.stdout


def write_server_yaml(directory: Path, port: int, token: str = "local-token") -> Path:
    directory.mkdir(parents=True)
    (directory / "server.yaml").write_text(yaml.safe_dump({"http": {"port": port}}))
    (directory / "admin.token").write_text(token + "\n")
    return directory / "server.yaml"


def test_the_client_config_lives_under_xdg_config_home_or_llmgw_config(home: dict[str, str]) -> None:
    assert client_config_path(home) == Path(home["XDG_CONFIG_HOME"]) / "llmgw" / "config.yaml"
    assert client_config_path({"HOME": "/h"}) == Path("/h/.config/llmgw/config.yaml")
    assert client_config_path({**home, "LLMGW_CLIENT_CONFIG": "/etc/x.yaml"}) == Path("/etc/x.yaml")


def test_context_set_writes_a_kubeconfig_like_file_readable_by_its_owner_only(home: dict[str, str]) -> None:
    ctl(home, "context", "set", "prod", "--url", "https://prod:8080", "--token", "secret")
    ctl(home, "context", "set", "lab", "--url", "http://lab:8080", "--token-file", "/keys/lab.token")
    path = client_config_path(home)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert yaml.safe_load(path.read_text()) == {
        "current-context": "prod",  # the first one added
        "contexts": [
            {"name": "prod", "url": "https://prod:8080", "token": "secret"},
            {"name": "lab", "url": "http://lab:8080", "token-file": "/keys/lab.token"},
        ],
    }


def test_context_list_use_and_remove(home: dict[str, str]) -> None:
    ctl(home, "context", "set", "prod", "--url", "https://prod:8080", "--token", "secret")
    ctl(home, "context", "set", "lab", "--url", "http://lab:8080", "--token", "t2")
    ctl(home, "context", "use", "lab")
    listed = json.loads(ctl(home, "context", "list", "--json"))
    assert [(c["name"], c["current"]) for c in listed] == [("prod", False), ("lab", True)]
    assert "secret" not in json.dumps(listed)
    ctl(home, "context", "remove", "lab")
    config = load_client_config(client_config_path(home))
    assert ([c.name for c in config.contexts], config.current_context) == (["prod"], "")


def test_changing_a_context_url_keeps_its_token(home: dict[str, str]) -> None:
    ctl(home, "context", "set", "prod", "--url", "https://old:8080", "--token", "secret")
    ctl(home, "context", "set", "prod", "--url", "https://new:8080")
    target = resolve_target(environ=home)
    assert (target.url, target.token) == ("https://new:8080", "secret")


def test_a_new_context_needs_a_url(home: dict[str, str]) -> None:
    with pytest.raises(ValidationFailed) as caught:
        ctl(home, "context", "set", "prod", "--token", "secret")
    assert caught.value.problems[0][0] == "--url"


def test_ctl_reaches_the_current_context_without_flags(
    home: dict[str, str], admin_server: AdminServer
) -> None:
    token_file = Path(home["HOME"]) / "prod.token"
    token_file.parent.mkdir(parents=True)
    token_file.write_text(admin_server.token + "\n")
    ctl(home, "context", "set", "prod", "--url", admin_server.url, "--token-file", str(token_file))
    replicas = json.loads(ctl(home, "replicas", "--json"))
    assert [r["id"] for r in replicas] == ["r-1"]


def test_flags_then_environment_then_context_then_this_machine(home: dict[str, str], tmp_path: Path) -> None:
    local = write_server_yaml(Path(home["XDG_DATA_HOME"]) / "llmgw" / "up", 18080)
    assert resolve_target(environ=home) == resolve_target(environ=home, server_config=local)
    assert (resolve_target(environ=home).url, resolve_target(environ=home).token) == (
        "http://127.0.0.1:18080",
        "local-token",
    )
    ctl(home, "context", "set", "prod", "--url", "https://prod:8080", "--token", "ctx-token")
    assert resolve_target(environ=home).token == "ctx-token"
    environ = {**home, "LLMGW_URL": "https://env:1", "LLMGW_ADMIN_TOKEN": "env-token"}
    assert (resolve_target(environ=environ).url, resolve_target(environ=environ).token) == (
        "https://env:1",
        "env-token",
    )
    flagged = resolve_target("https://flag:2", "flag-token", environ=environ)
    assert (flagged.url, flagged.token) == ("https://flag:2", "flag-token")


def test_a_context_lends_its_token_to_its_own_url_only(home: dict[str, str]) -> None:
    write_server_yaml(Path(home["XDG_DATA_HOME"]) / "llmgw" / "up", 18080)
    ctl(home, "context", "set", "prod", "--url", "https://prod:8080", "--token", "ctx-token")
    assert resolve_target("https://prod:8080/", environ=home).token == "ctx-token"
    assert resolve_target("https://elsewhere:8080", environ=home).token == "local-token"


def test_a_current_context_that_does_not_exist_says_what_to_do(home: dict[str, str]) -> None:
    path = client_config_path(home)
    path.parent.mkdir(parents=True)
    path.write_text("current-context: gone\ncontexts: []\n")
    with pytest.raises(ConfigError) as caught:
        resolve_target(environ=home)
    assert "context use" in caught.value.hint


def test_nothing_to_talk_to_names_every_way_to_say_where(home: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_target(environ=home)
    assert "--url" in caught.value.hint and "context set" in caught.value.hint
