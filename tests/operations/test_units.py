"""The systemd units and ``llmgw service`` (C10.1): rendering, systemd-analyze verify, systemctl calls."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.errors import LlmgwError
from llmgw.operations.units import (
    ROLES,
    UNIT_DIR,
    Completed,
    Systemd,
    UnitPaths,
    act,
    install_units,
    installed_roles,
    render_unit,
    unit_name,
)
from llmgw.testing.components import skip_missing

REPO = Path(__file__).resolve().parents[2]
LLMGW = str(Path(sys.executable).with_name("llmgw"))


class RecordingSystemctl:
    """Stands in for the machine's commands: records each, answers ``show`` from ``states``."""

    def __init__(self, answer: Completed | None = None) -> None:
        self.calls: list[list[str]] = []
        self.answer = answer or Completed(0, "", "")
        self.states: dict[str, str] = {}

    def __call__(self, argv: Sequence[str]) -> Completed:
        self.calls.append(list(argv))
        if "show" in argv and self.answer.returncode == 0:
            return Completed(0, self.states.get(argv[-1], "LoadState=not-found\n"), "")
        return self.answer


def _option(unit: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith(f"{key}=")]


def test_the_agent_is_the_only_process_systemd_signals_so_engines_survive_its_restart() -> None:
    unit = render_unit("agent", UnitPaths())
    assert _option(unit, "KillMode") == ["process"]
    assert _option(unit, "ExecStart")[0].endswith("agent run --config /etc/llmgw/agent.yaml --keep-engines")
    assert _option(unit, "Restart") == ["on-failure"]


def test_the_agents_hardening_leaves_the_gpus_reachable() -> None:
    unit = render_unit("agent", UnitPaths())
    for breaks_gpus in (
        "PrivateDevices",
        "DevicePolicy",
        "DeviceAllow",
        "MemoryDenyWriteExecute",
        "PrivateTmp",
    ):
        assert not _option(unit, breaks_gpus), breaks_gpus
    assert _option(unit, "User") == ["root"]
    assert _option(unit, "NoNewPrivileges") == ["yes"]


def test_the_control_plane_runs_as_its_own_user_with_only_the_capabilities_it_needs() -> None:
    unit = render_unit("server", UnitPaths("/opt/llmgw/bin/llmgw", "/srv/llmgw/etc", "/srv/llmgw/data"))
    assert _option(unit, "User") == ["llmgw"] and _option(unit, "Group") == ["llmgw"]
    assert _option(unit, "ExecStart") == [
        "/opt/llmgw/bin/llmgw server run --config /srv/llmgw/etc/server.yaml"
    ]
    assert _option(unit, "CapabilityBoundingSet") == ["CAP_NET_ADMIN CAP_NET_BIND_SERVICE"]
    assert _option(unit, "ReadWritePaths") == ["-/srv/llmgw/data -/srv/llmgw/etc -/run/llmgw"]
    assert _option(unit, "Restart") == ["on-failure"]


def test_an_unknown_role_is_named() -> None:
    with pytest.raises(LlmgwError, match="'gateway'"):
        render_unit("gateway", UnitPaths())


@pytest.mark.parametrize("role", ROLES)
def test_the_shipped_units_are_the_rendered_ones_for_the_default_paths(role: str) -> None:
    shipped = (REPO / "deploy" / "systemd" / unit_name(role)).read_text()
    assert shipped == render_unit(role, UnitPaths())


def needs(tool: str) -> None:
    """Skip for lack of ``tool`` (make opstools installs it): a failure under CI=true."""
    if not shutil.which(tool):
        skip_missing(tool, "run 'make opstools' (apt-get install systemd)")


@pytest.mark.parametrize("role", ROLES)
def test_systemd_analyze_verifies_each_unit(tmp_path: Path, role: str) -> None:
    needs("systemd-analyze")
    path = tmp_path / unit_name(role)
    path.write_text(render_unit(role, UnitPaths(executable=LLMGW)))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == ""


def test_systemd_analyze_would_catch_a_broken_unit(tmp_path: Path) -> None:
    needs("systemd-analyze")
    path = tmp_path / unit_name("agent")
    path.write_text(render_unit("agent", UnitPaths(executable=str(tmp_path / "missing"))))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "not executable" in done.stderr


def test_install_under_a_root_writes_the_units_and_enables_them_offline(tmp_path: Path) -> None:
    runner = RecordingSystemctl()
    written = install_units(
        ["server", "agent"], UnitPaths(executable=LLMGW), tmp_path, Systemd(runner, tmp_path)
    )
    assert [p.name for p in written] == ["llmgw-server.service", "llmgw-agent.service"]
    assert (tmp_path / UNIT_DIR / "llmgw-agent.service").read_text() == render_unit("agent", UnitPaths(LLMGW))
    assert runner.calls == [
        ["systemctl", f"--root={tmp_path}", "enable", "llmgw-server.service", "llmgw-agent.service"]
    ]
    assert installed_roles(tmp_path) == ["server", "agent"]


def test_install_on_the_machine_makes_the_user_reloads_and_enables(tmp_path: Path) -> None:
    runner = RecordingSystemctl()
    paths = UnitPaths(LLMGW, "/etc/llmgw", "/var/lib/llmgw")
    install_units(["server"], paths, tmp_path, Systemd(runner), user_exists=False)
    assert runner.calls[0][:2] == ["useradd", "--system"] and runner.calls[0][-1] == "llmgw"
    assert ["chown", "-R", "llmgw:llmgw", "/etc/llmgw"] in runner.calls
    assert runner.calls[-2:] == [
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "llmgw-server.service"],
    ]


def test_real_systemctl_enables_units_under_a_root_without_systemd_running(tmp_path: Path) -> None:
    needs("systemctl")
    install_units(["agent"], UnitPaths(executable=LLMGW), tmp_path, Systemd(root=tmp_path))
    wanted = tmp_path / "etc/systemd/system/multi-user.target.wants/llmgw-agent.service"
    assert wanted.is_symlink()


def test_the_control_plane_starts_first_and_stops_last() -> None:
    runner = RecordingSystemctl()
    assert act("start", ["agent", "server"], Systemd(runner)) == [
        "llmgw-server.service",
        "llmgw-agent.service",
    ]
    assert act("stop", ["server", "agent"], Systemd(runner)) == [
        "llmgw-agent.service",
        "llmgw-server.service",
    ]
    assert runner.calls[-2:] == [
        ["systemctl", "stop", "llmgw-agent.service"],
        ["systemctl", "stop", "llmgw-server.service"],
    ]


def test_status_reads_each_units_state() -> None:
    runner = RecordingSystemctl()
    runner.states["llmgw-agent.service"] = (
        "LoadState=loaded\nActiveState=active\nSubState=running\nUnitFileState=enabled\nMainPID=4242\n"
    )
    state = Systemd(runner).state("llmgw-agent.service")
    assert (state.installed, state.active, state.sub, state.enabled, state.pid) == (
        True,
        "active",
        "running",
        "enabled",
        4242,
    )
    assert not Systemd(runner).state("llmgw-server.service").installed


def test_a_machine_without_systemd_running_is_said_so() -> None:
    said = "System has not been booted with systemd as init system (PID 1). Can't operate.\n"
    runner = RecordingSystemctl(Completed(1, "", said + "Failed to connect to bus: Host is down\n"))
    with pytest.raises(LlmgwError) as raised:
        act("restart", ["agent"], Systemd(runner))
    assert "systemd is not running on this machine" in raised.value.message
    assert "PID 1" in raised.value.hint


def test_another_systemctl_failure_says_what_it_said() -> None:
    runner = RecordingSystemctl(Completed(5, "", "Unit llmgw-agent.service not found.\n"))
    with pytest.raises(LlmgwError, match="not found") as raised:
        act("start", ["agent"], Systemd(runner))
    assert "journalctl" in raised.value.hint


def test_the_command_installs_under_a_root_and_refuses_actions_on_units_not_installed(tmp_path: Path) -> None:
    cli = CliRunner()
    answer = cli.invoke(app, ["service", "start", "--root", str(tmp_path)])
    assert isinstance(answer.exception, LlmgwError)
    assert "no llmgw unit is installed" in answer.exception.message
    (tmp_path / "etc/llmgw").mkdir(parents=True)
    (tmp_path / "etc/llmgw/agent.yaml").write_text("node_id: n1\n")
    if shutil.which("systemctl"):
        answer = cli.invoke(app, ["service", "install", "--root", str(tmp_path), "--executable", LLMGW])
        assert answer.exit_code == 0, answer.output
        assert installed_roles(tmp_path) == ["agent"]


def test_status_under_a_root_reads_the_unit_files_only(tmp_path: Path) -> None:
    runner = RecordingSystemctl(Completed(0, "enabled\n", ""))
    install_units(["agent"], UnitPaths(executable=LLMGW), tmp_path, Systemd(runner, tmp_path))
    state = Systemd(runner, tmp_path).state("llmgw-agent.service")
    assert (state.installed, state.enabled, state.active) == (True, "enabled", "unknown (offline root)")
    assert runner.calls[-1] == ["systemctl", f"--root={tmp_path}", "is-enabled", "llmgw-agent.service"]
