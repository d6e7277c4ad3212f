"""A real OpenSSH server on loopback for onboarding's end-to-end tests, with its own keys and /etc.

``sshd`` (Debian's openssh-server) runs on a free port with a host key, a
config and an authorized key of the test's own, inside a mount namespace
(``unshare -m``) where ``/etc`` is a copy kept in the test's directory: what
onboarding does to users and groups (``useradd``, ``groupadd``) lands in that
copy, never in this machine's ``/etc``. Processes started over SSH inherit
the namespace. Needs root (as the tests' machine is).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.mirror.releases import write_release
from llmgw.pki.signing import generate_signing_key
from llmgw.testing.cluster import free_port, wait_for

SSHD = "/usr/sbin/sshd"


def available() -> str:
    """Why an sshd cannot run here ("" when it can)."""
    if not Path(SSHD).exists():
        return f"{SSHD} is missing (apt-get install openssh-server)"
    if shutil.which("unshare") is None or shutil.which("ssh") is None:
        return "unshare or ssh is missing"
    return ""


@dataclass
class Sshd:
    """An sshd for root on ``127.0.0.1:port``; ``key`` logs in, ``known_hosts`` starts empty."""

    home: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def key(self) -> Path:
        return self.home / "client_key"

    @property
    def known_hosts(self) -> Path:
        return self.home / "known_hosts"

    @property
    def etc(self) -> Path:
        """The /etc the server and everything it starts see."""
        return self.home / "etc"

    @property
    def log(self) -> Path:
        return self.home / "sshd.log"

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        for name in ("host_key", "client_key"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.home / name)], check=True
            )
        shutil.copy(self.home / "client_key.pub", self.home / "authorized_keys")
        self.known_hosts.write_text("")
        subprocess.run(["cp", "-a", "/etc", str(self.etc)], check=True)
        config = self.home / "sshd_config"
        config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.home / 'host_key'}\n"
            f"PidFile {self.home / 'sshd.pid'}\nAuthorizedKeysFile {self.home / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "UsePAM no\nStrictModes no\nPrintMotd no\nAcceptEnv none\n"
        )
        script = f"mount --bind {self.etc} /etc && mkdir -p /run/sshd && exec {SSHD} -D -e -f {config}"
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        wait_for(self._listening, 15, f"sshd listens on 127.0.0.1:{self.port}")

    def _listening(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"sshd exited: {self.log.read_text(errors='replace')}")
        done = subprocess.run(
            ["ssh-keyscan", "-p", str(self.port), "-T", "2", "127.0.0.1"], capture_output=True, check=False
        )
        return b"ssh-ed25519" in done.stdout

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(15)


def signed_release(home: Path, source: Path) -> Path:
    """A release of the source tree at ``source``, signed by a new key: its directory under ``home``
    (``trusted.pub`` and ``release.key`` beside it)."""
    home.mkdir(parents=True, exist_ok=True)
    generate_signing_key(home / "release.key", home / "trusted.pub")
    wheels = home / "wheel"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(source),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("llmgw-*.whl")
    write_release(home / "release", wheel, home / "release.key")
    return home / "release"


def stop_detached(root: Path, name: str, config: str) -> None:
    """Stop a service onboarding started detached under ``root``, found by its pid file and command line."""
    pid_file = root / f"var/lib/llmgw/{name}.pid"
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text())
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.exists() and f"{root}/{config}".encode() in cmdline.read_bytes():
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), 30, f"{name} (pid {pid}) ends")
