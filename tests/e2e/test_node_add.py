"""``llmgw node add`` end to end: a real sshd on loopback, a signed release built here, a real control plane.

The machine being added is this one seen through sshd (its own host key,
config and /etc: :mod:`llmgw.testing.sshd`); llmgw goes under a directory of
the test's (``--root``), into a venv that takes its dependencies from this
Python's environment (``--installed-deps``). There is no systemd here, so
the agent runs detached with a pid file, which the test checks.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.testing import sshd
from llmgw.testing.cluster import Cluster, free_port
from llmgw.testing.components import missing

from .console_ssh import no_context, run_in_console

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        bool(sshd.available()), reason=missing("sshd", f"{sshd.available()}; run 'make sshd'")
    ),
]

SOURCE = Path(__file__).resolve().parents[2]
METRICS_PORT = free_port()
STEPS = ("connect", "install", "user", "certificate", "config", "service", "join")


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A signed release of this source tree (trusted.pub beside its directory)."""
    return sshd.signed_release(tmp_path_factory.mktemp("release"), SOURCE)


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[sshd.Sshd]:
    server = sshd.Sshd(tmp_path / "sshd")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def cluster(tmp_path: Path, signed: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path / "cluster", tmp_path / "cache") as running:
        shutil.copy(signed.parent / "trusted.pub", running.home / "trusted.pub")
        running.start_server()
        yield running


def node_add(
    cluster: Cluster, machine: sshd.Sshd, root: Path, release: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-m", "llmgw.cli.main", "node", "add", "127.0.0.1",
        "--name", "n1", "--port", str(machine.port), "--identity", str(machine.key),
        "--known-hosts", str(machine.known_hosts), "--release", str(release),
        "--python", sys.executable, "--installed-deps", "--root", str(root),
        "--metrics-port", str(METRICS_PORT), "--timeout", "60",
        "--config", str(cluster.home / "server.yaml"), *extra,
    ]  # fmt: skip
    env = {name: value for name, value in os.environ.items() if not name.startswith("LLMGW_")}
    env["COLUMNS"] = "200"
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=False)


def agent_pid(root: Path) -> int:
    pid = int((root / "var/lib/llmgw/llmgw-agent.pid").read_text())
    assert b"agent\0run" in Path(f"/proc/{pid}/cmdline").read_bytes()
    return pid


def test_node_add_installs_registers_and_changes_nothing_the_second_time_nor_from_the_console(
    tmp_path: Path, machine: sshd.Sshd, cluster: Cluster, signed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "machine"
    try:
        first = node_add(cluster, machine, root, signed, "--accept-host-key")
        assert first.returncode == 0, first.stdout + first.stderr + cluster.tails()
        for step in STEPS:
            assert f"  {step} " in first.stdout
        assert "changed: installed llmgw" in first.stdout
        nodes = {node["id"]: node for node in cluster.admin.get("/api/nodes")}
        assert nodes["n1"]["connected"]
        pid = agent_pid(root)
        passwd = (machine.etc / "passwd").read_text()
        assert "\nllmgw-engine:" in "\n" + passwd
        groups = {
            line.split(":")[0]: line.split(":")[3]
            for line in (machine.etc / "group").read_text().splitlines()
        }
        assert "llmgw-engine" in groups["video"].split(",") and "llmgw-engine" in groups["render"].split(",")
        assert "llmgw-engine" not in (Path("/etc/passwd").read_text())
        assert (root / "etc/llmgw/node.key").stat().st_mode & 0o777 == 0o600

        second = node_add(cluster, machine, root, signed)
        assert second.returncode == 0, second.stdout + second.stderr
        assert " changed:" not in second.stdout
        for step in ("install", "user", "certificate", "config", "service"):
            assert f"  {step:<12} unchanged: " in second.stdout, second.stdout
        assert "nothing changed" in second.stdout
        assert agent_pid(root) == pid

        # the console's add-node runs the same steps: with the command's inputs, nothing to change
        no_context(monkeypatch, tmp_path)
        fields: dict[str, str | bool] = {
            "config": str(cluster.home / "server.yaml"), "host": "127.0.0.1", "name": "n1",
            "metrics_port": str(METRICS_PORT), "port": str(machine.port), "identity": str(machine.key),
            "known_hosts": str(machine.known_hosts), "release": str(signed), "python": sys.executable,
            "installed_deps": True, "timeout": "60",
        }  # fmt: skip
        ran = asyncio.run(run_in_console(cluster.admin, "add-node", fields, root=root))
        assert "Make 127.0.0.1 node n1 of cp1's cluster over SSH" in ran.question
        assert ran.result == "done: nothing changed (all steps as they were)", ran.progress
        assert [line.split()[0] for line in ran.progress] == ["adding", *STEPS]
        assert all(" unchanged: " in line for line in ran.progress[2:-1]), ran.progress
        assert ran.nodes == ["n1"] and agent_pid(root) == pid
    finally:
        sshd.stop_detached(root, "llmgw-agent", "etc/llmgw/agent.yaml")


def test_a_tampered_release_is_refused_at_the_install_step(
    tmp_path: Path, machine: sshd.Sshd, cluster: Cluster, signed: Path
) -> None:
    tampered = tmp_path / "tampered"
    shutil.copytree(signed, tampered)
    (wheel,) = tampered.glob("*.whl")
    with wheel.open("ab") as out:
        out.write(b"\0")
    root = tmp_path / "machine"
    refused = node_add(cluster, machine, root, tampered, "--accept-host-key")
    assert refused.returncode == 1
    assert "step 'install' failed" in refused.stdout and "altered" in refused.stdout, refused.stdout
    assert not (root / "opt/llmgw").exists()

    (tampered / "SHA256SUMS.sig").unlink()
    shutil.copy(signed / wheel.name, wheel)
    unsigned = node_add(cluster, machine, root, tampered, "--accept-host-key")
    assert unsigned.returncode == 1
    assert "step 'install' failed" in unsigned.stdout and "not signed" in unsigned.stdout, unsigned.stdout


def test_an_unknown_host_key_is_refused_at_the_connect_step(
    tmp_path: Path, machine: sshd.Sshd, cluster: Cluster, signed: Path
) -> None:
    refused = node_add(cluster, machine, tmp_path / "machine", signed)
    assert refused.returncode == 1
    assert "step 'connect' failed" in refused.stdout and "--accept-host-key" in refused.stdout, refused.stdout
    assert machine.known_hosts.read_text() == ""
