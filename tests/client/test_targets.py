"""Where this machine's control plane listens, read from server.yaml without the server's config."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.client import paths
from llmgw.client.paths import resolve_server_config
from llmgw.client.targets import Listening, read_server_address
from llmgw.controlplane.config import HttpSettings
from llmgw.errors import ConfigError


def test_an_address_left_out_is_the_servers_default() -> None:
    server = HttpSettings()
    assert (Listening().host, Listening().port) == (server.host, server.port)


def test_the_http_section_is_read_and_the_rest_left_to_the_server(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(
        "name: cp1\nstore:\n  url: ''\nhttp:\n  host: 10.0.0.5\n  port: 9090\n  keep_alive_s: 30\n"
    )
    assert read_server_address(path) == Listening(host="10.0.0.5", port=9090)


def test_a_bad_port_names_the_file_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text("http:\n  port: 70000\n")
    with pytest.raises(ConfigError) as caught:
        read_server_address(path)
    assert str(path) in caught.value.message and "http.port" in caught.value.message


def test_server_yaml_given_is_taken_else_found_else_said_how_to_make_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(paths, "SYSTEM_DIR", tmp_path / "etc")  # not this machine's /etc/llmgw
    given = tmp_path / "given.yaml"
    assert resolve_server_config(given, {"HOME": str(tmp_path)}) == given
    found = tmp_path / "found.yaml"
    found.write_text("name: c\n")
    assert resolve_server_config(None, {"HOME": str(tmp_path), "LLMGW_CONFIG": str(found)}) == found
    with pytest.raises(ConfigError, match=r"no server\.yaml found") as raised:
        resolve_server_config(None, {"HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data")})
    assert "llmgw server init" in (raised.value.hint or "")
