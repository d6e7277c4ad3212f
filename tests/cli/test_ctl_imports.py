"""``llmgw ctl`` is a client: through the real entry point it loads none of the server's parts."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SERVER_PARTS = ("llmgw.store", "llmgw.gateway", "llmgw.controlplane", "sqlalchemy", "fastapi", "starlette")

# Runs the ``llmgw`` console script's function with the words given, then writes the modules it loaded.
RUN = """
import json, sys
from llmgw.cli.main import main
sys.argv = ["llmgw", *sys.argv[2:]]
try:
    main()
finally:
    with open(OUT, "w") as out:
        json.dump(sorted(sys.modules), out)
"""


@pytest.fixture
def refusing() -> Iterator[str]:
    """A control plane address that refuses connections: a port held bound, not listening."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{held.getsockname()[1]}"


def _loaded(
    tmp_path: Path, *words: str, environment: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    out = tmp_path / "modules.json"
    script = RUN.replace("OUT", repr(str(out)))
    environ = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    for name in ("LLMGW_URL", "LLMGW_ADMIN_TOKEN", "LLMGW_CONFIG", "LLMGW_HOME", "LLMGW_CLIENT_CONFIG"):
        environ.pop(name, None)
    environ.update(environment or {})
    done = subprocess.run(
        [sys.executable, "-c", script, "llmgw", *words],
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
    )
    return done, json.loads(out.read_text())


def _server_parts(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == part or m.startswith(part + ".") for part in SERVER_PARTS)]


def test_ctl_help_loads_no_part_of_the_server(tmp_path: Path) -> None:
    done, modules = _loaded(tmp_path, "ctl", "--help")
    assert done.returncode == 0, done.stderr
    assert "status" in done.stdout
    assert _server_parts(modules) == []


def test_a_ctl_call_loads_no_part_of_the_server(tmp_path: Path, refusing: str) -> None:
    done, modules = _loaded(tmp_path, "ctl", "status", "--json", "--url", refusing, "--token", "t")
    assert done.returncode == 1
    assert "cannot reach the control plane" in done.stderr
    assert "llmgw.client.admin" in modules
    assert _server_parts(modules) == []


def test_a_ctl_call_on_this_machines_control_plane_loads_no_part_of_the_server(
    tmp_path: Path, refusing: str
) -> None:
    """The target comes from server.yaml here (``llmgw up``'s home): read without the server's config."""
    home = tmp_path / "up"
    home.mkdir()
    port = refusing.rsplit(":", 1)[1]
    (home / "server.yaml").write_text(f"name: cp1\nhttp:\n  port: {port}\n")
    (home / "admin.token").write_text("t\n")
    done, modules = _loaded(tmp_path, "ctl", "status", "--json", environment={"LLMGW_HOME": str(home)})
    assert done.returncode == 1
    assert f"cannot reach the control plane at http://127.0.0.1:{port}" in " ".join(done.stderr.split())
    assert _server_parts(modules) == []


def test_every_top_level_command_is_built_under_its_name() -> None:
    import typer

    from llmgw.cli.main import COMMANDS, app

    root = typer.main.get_command(app)
    context = typer.Context(root)
    assert root.list_commands(context) == list(COMMANDS)  # type: ignore[attr-defined]
    for name in COMMANDS:
        built = root.get_command(context, name)  # type: ignore[attr-defined]
        assert built is not None and built.name == name
