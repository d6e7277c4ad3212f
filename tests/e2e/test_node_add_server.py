"""``llmgw server add HOST`` end to end: a standby set up over a real sshd joins a cluster on PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.controlplane.config import load_server_config
from llmgw.testing import postgres, sshd
from llmgw.testing.cluster import Cluster, free_port
from llmgw.testing.components import missing

from .console_ssh import no_context, run_in_console

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        bool(sshd.available()), reason=missing("sshd", f"{sshd.available()}; run 'make sshd'")
    ),
    pytest.mark.skipif(
        not postgres.available(), reason=missing("PostgreSQL's server binaries", "run 'make postgres'")
    ),
]


SOURCE = Path(__file__).resolve().parents[2]
VIP = "10.99.0.100/24"


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sshd.signed_release(tmp_path_factory.mktemp("release"), SOURCE)


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[sshd.Sshd]:
    server = sshd.Sshd(tmp_path / "sshd")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def cluster(tmp_path: Path, signed: Path) -> Iterator[Cluster]:
    with postgres.PostgresServer.start() as database:
        with Cluster(tmp_path / "cluster", tmp_path / "cache", store_url=database.url) as running:
            shutil.copy(signed.parent / "trusted.pub", running.home / "trusted.pub")
            running.start_server()
            yield running


def server_add(
    cluster: Cluster, machine: sshd.Sshd, root: Path, release: Path, ports: tuple[int, int], *extra: str
) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-m", "llmgw.cli.main", "server", "add", "127.0.0.1", "--name", "cp2",
        "--http-port", str(ports[0]), "--agent-port", str(ports[1]),
        "--port", str(machine.port), "--identity", str(machine.key),
        "--known-hosts", str(machine.known_hosts),
        "--release", str(release), "--python", sys.executable, "--installed-deps", "--root", str(root),
        "--timeout", "60", "--config", str(cluster.home / "server.yaml"), *extra,
    ]  # fmt: skip
    env = {name: value for name, value in os.environ.items() if not name.startswith("LLMGW_")}
    env["COLUMNS"] = "200"
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=False)


def test_server_add_starts_a_joining_standby_unchanged_the_second_time_and_the_console_adds_its_vip(
    tmp_path: Path,
    machine: sshd.Sshd,
    cluster: Cluster,
    signed: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = tmp_path / "machine"
    ports = (free_port(), free_port())
    try:
        first = server_add(cluster, machine, root, signed, ports, "--accept-host-key")
        assert first.returncode == 0, first.stdout + first.stderr
        assert "  mirror       ok: " in first.stdout and "changed: issued server.crt" in first.stdout
        assert "user" not in first.stdout.split("\n", 1)[1].split()
        planes = {plane["name"]: plane for plane in cluster.admin.get("/api/status")["control_planes"]}
        assert planes["cp2"]["role"] == "standby"
        assert (root / "etc/llmgw/server.key").stat().st_mode & 0o777 == 0o600

        second = server_add(cluster, machine, root, signed, ports)
        assert second.returncode == 0, second.stdout + second.stderr
        assert " changed:" not in second.stdout and "nothing changed" in second.stdout, second.stdout

        # the console's add-control-plane, with a floating address: its certificate covers it, keepalived's
        # configuration and server.yaml name it, and the standby is restarted with them
        no_context(monkeypatch, tmp_path)
        fields: dict[str, str | bool] = {
            "config": str(cluster.home / "server.yaml"), "host": "127.0.0.1", "name": "cp2",
            "http_port": str(ports[0]), "agent_port": str(ports[1]), "vip": VIP, "interface": "lo",
            "port": str(machine.port), "identity": str(machine.key), "known_hosts": str(machine.known_hosts),
            "release": str(signed), "python": sys.executable, "installed_deps": True, "timeout": "60",
        }  # fmt: skip
        ran = asyncio.run(run_in_console(cluster.admin, "add-control-plane", fields, root=root))
        assert f"keeping {VIP} (on lo) on the leader" in ran.question
        assert ran.result == "done: certificate, config, service changed", ran.progress
        written = load_server_config(root / "etc/llmgw/server.yaml")
        assert written.leadership.vip == VIP and VIP in (root / "etc/llmgw/keepalived.conf").read_text()
        assert "cp2" in ran.control_planes
    finally:
        sshd.stop_detached(root, "llmgw-server", "etc/llmgw/server.yaml")
