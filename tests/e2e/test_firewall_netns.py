"""llmgw's table applied by the real ``nft`` in a network namespace the test makes (C10.2).

Two namespaces joined by a veth pair on 198.18.7.0/24 (RFC 2544's
benchmarking range, never routed): the "machine" (198.18.7.1) runs a listener
on a control plane's ports and an engine's, the "peer" side holds a control
plane's address (.2) and a stranger's (.3). ``llmgw firewall sync`` runs in
the machine's namespace; connections are tried from each source address.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.operations.firewall import agent_part, server_part
from llmgw.operations.nftables import FirewallState
from llmgw.testing.components import missing

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make network namespaces"),
    pytest.mark.skipif(
        not shutil.which("ip") or not shutil.which("nft"),
        reason=missing("ip and nft", "run 'make opstools' (apt-get install nftables iproute2)"),
    ),
]

SUBNET = "198.18.7"
MACHINE, PEER, STRANGER = f"{SUBNET}.1", f"{SUBNET}.2", f"{SUBNET}.3"
HTTP, AGENT_SERVER, ENGINE = 18080, 18443, 21000

LISTENER = textwrap.dedent(
    """
    import socket, selectors, sys
    sel = selectors.DefaultSelector()
    for port in map(int, sys.argv[1:]):
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port)); s.listen(16); sel.register(s, selectors.EVENT_READ)
    print("listening", flush=True)
    while True:
        for key, _ in sel.select():
            conn, _ = key.fileobj.accept(); conn.sendall(b"ok"); conn.close()
    """
)

PROBE = textwrap.dedent(
    """
    import json, socket, sys
    source, target = sys.argv[1], sys.argv[2]
    out = {}
    for port in map(int, sys.argv[3:]):
        s = socket.socket(); s.settimeout(3); s.bind((source, 0))
        try:
            s.connect((target, port)); out[port] = s.recv(2).decode()
        except OSError as error:
            out[port] = type(error).__name__
        finally:
            s.close()
    print(json.dumps(out))
    """
)


def _sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30).stdout


class Namespaces:
    def __init__(self, tag: str) -> None:
        self.machine = f"llmgwfw-m{tag}"
        self.peer = f"llmgwfw-p{tag}"

    def make(self) -> None:
        _sh("ip", "netns", "add", self.machine)
        _sh("ip", "netns", "add", self.peer)
        _sh(
            "ip",
            "-n",
            self.machine,
            "link",
            "add",
            "fw0",
            "type",
            "veth",
            "peer",
            "name",
            "fw1",
            "netns",
            self.peer,
        )
        _sh("ip", "-n", self.machine, "addr", "add", f"{MACHINE}/24", "dev", "fw0")
        _sh("ip", "-n", self.peer, "addr", "add", f"{PEER}/24", "dev", "fw1")
        _sh("ip", "-n", self.peer, "addr", "add", f"{STRANGER}/24", "dev", "fw1")
        for ns, dev in ((self.machine, "fw0"), (self.peer, "fw1")):
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh("ip", "-n", ns, "link", "set", dev, "up")

    def remove(self) -> None:
        for ns in (self.machine, self.peer):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)

    def run(self, ns: str, *argv: str) -> str:
        return _sh("ip", "netns", "exec", ns, *argv)

    def probe(self, source: str, target: str = MACHINE, ns: str = "") -> dict[int, str]:
        text = self.run(
            ns or self.peer,
            sys.executable,
            "-c",
            PROBE,
            source,
            target,
            str(HTTP),
            str(AGENT_SERVER),
            str(ENGINE),
        )
        return {int(k): v for k, v in json.loads(text).items()}


@pytest.fixture
def namespaces() -> Iterator[Namespaces]:
    spaces = Namespaces(str(os.getpid()))
    spaces.remove()
    spaces.make()
    listener = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            spaces.machine,
            sys.executable,
            "-c",
            LISTENER,
            str(HTTP),
            str(AGENT_SERVER),
            str(ENGINE),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "listening"
        yield spaces
    finally:
        os.kill(listener.pid, signal.SIGTERM)
        listener.wait(timeout=10)
        spaces.remove()


def _write_parts(state: Path, *, enabled: bool = True, networks: list[str] | None = None) -> None:
    parts = FirewallState(state)
    parts.write(
        server_part(
            "cp1",
            enabled=enabled,
            networks=networks or [],
            http=(MACHINE, HTTP),
            agent_server=(MACHINE, AGENT_SERVER),
            peers=[PEER],
        )
    )
    parts.write(
        agent_part("n1", enabled=enabled, address=MACHINE, ports=(ENGINE, ENGINE + 9), control_planes=[PEER])
    )


def _sync(spaces: Namespaces, state: Path) -> dict[str, object]:
    out = spaces.run(
        spaces.machine,
        sys.executable,
        "-m",
        "llmgw.cli.main",
        "firewall",
        "sync",
        "--state-dir",
        str(state),
        "--json",
    )
    result: dict[str, object] = json.loads(out)
    return result


def test_the_table_lets_peers_in_and_refuses_strangers(namespaces: Namespaces, tmp_path: Path) -> None:
    assert namespaces.probe(STRANGER) == {HTTP: "ok", AGENT_SERVER: "ok", ENGINE: "ok"}  # no table yet
    _write_parts(tmp_path)
    assert _sync(namespaces, tmp_path)["applied"] is True

    assert namespaces.probe(PEER) == {HTTP: "ok", AGENT_SERVER: "ok", ENGINE: "ok"}
    refused = "ConnectionRefusedError"
    assert namespaces.probe(STRANGER) == {HTTP: "ok", AGENT_SERVER: refused, ENGINE: refused}
    # loopback inside the machine always passes
    local = namespaces.probe("127.0.0.1", "127.0.0.1", ns=namespaces.machine)
    assert local == {HTTP: "ok", AGENT_SERVER: "ok", ENGINE: "ok"}


def test_http_from_the_configured_networks_only(namespaces: Namespaces, tmp_path: Path) -> None:
    _write_parts(tmp_path, networks=[f"{PEER}/32"])
    _sync(namespaces, tmp_path)
    assert namespaces.probe(PEER)[HTTP] == "ok"
    assert namespaces.probe(STRANGER)[HTTP] == "ConnectionRefusedError"


def test_other_tables_survive_syncs_and_turning_the_firewall_off(
    namespaces: Namespaces, tmp_path: Path
) -> None:
    rules = "table ip keepme {\n chain c {\n  type filter hook input priority 10; policy accept;\n"
    rules += "  counter\n }\n}\n"
    subprocess.run(
        ["ip", "netns", "exec", namespaces.machine, "nft", "-f", "-"], input=rules, text=True, check=True
    )
    _write_parts(tmp_path)
    _sync(namespaces, tmp_path)
    _sync(namespaces, tmp_path)  # a second sync replaces llmgw's table, never adds a second
    tables = namespaces.run(namespaces.machine, "nft", "list", "tables").split("\n")
    assert sorted(t for t in tables if t) == ["table inet llmgw", "table ip keepme"]

    _write_parts(tmp_path, enabled=False)
    assert _sync(namespaces, tmp_path)["applied"] is False
    tables = namespaces.run(namespaces.machine, "nft", "list", "tables").split("\n")
    assert [t for t in tables if t] == ["table ip keepme"]
    assert "counter" in namespaces.run(namespaces.machine, "nft", "list", "table", "ip", "keepme")
    assert namespaces.probe(STRANGER) == {HTTP: "ok", AGENT_SERVER: "ok", ENGINE: "ok"}
