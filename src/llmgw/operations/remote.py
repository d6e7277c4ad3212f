"""A shell on another machine, over the system's OpenSSH client.

llmgw runs the ``ssh`` program rather than a library of its own: the
operator's ``~/.ssh/config``, agent, jump hosts, certificates and
``known_hosts`` then apply as they do to their own ``ssh``, and no second
SSH implementation has to be trusted or kept in step with the server's.
Every command runs in ``BatchMode`` (never a password prompt) with strict
host key checking: a host not in ``known_hosts`` is refused unless the
operator asked to record its key (``accept_host_key``, OpenSSH's
``accept-new``), and a changed key is always refused.

A :class:`Shell` is what the onboarding steps talk to: :class:`SshShell` over
SSH, :class:`LocalShell` on this machine (the seam the steps' tests use).
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

from llmgw.errors import LlmgwError

NOT_FOUND = 3
"""The exit status :meth:`Shell.read` scripts give for a file that is not there."""


class RemoteError(LlmgwError):
    """A command on the other machine could not run or failed."""


class HostKeyRefused(RemoteError):
    """The other machine's host key is not in known_hosts (or differs from the one there)."""


@dataclass(frozen=True)
class Completed:
    """A finished command: its exit status and what it wrote."""

    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")

    @property
    def errors(self) -> str:
        return self.stderr.decode(errors="replace").strip()


class Shell(Protocol):
    """Where onboarding runs its scripts: ``sh -c SCRIPT`` with ``data`` on its standard input."""

    @property
    def where(self) -> str:
        """The machine, for messages."""
        ...

    def run(self, script: str, data: bytes = b"", timeout_s: float = 300.0) -> Completed:
        """Run ``script``; the completed command, whatever its status (RemoteError if it cannot run)."""
        ...


@dataclass(frozen=True)
class Target:
    """How to reach a machine over SSH."""

    host: str
    user: str = "root"
    port: int = 22
    identity: Path | None = None
    """A private key to log in with (default: ssh's own, and its agent's)."""
    known_hosts: Path | None = None
    """The known_hosts file (default: ssh's own, ``~/.ssh/known_hosts``)."""
    accept_host_key: bool = False
    """Record the key of a host not yet in known_hosts (a changed key is still refused)."""
    connect_timeout_s: int = 10
    program: str = "ssh"

    def command(self, script: str) -> list[str]:
        """The ssh command line that runs ``script`` under ``sh -c`` on the target."""
        argv = [
            self.program,
            "-p",
            str(self.port),
            "-l",
            self.user,
            "-o",
            "BatchMode=yes",
            "-o",
            f"StrictHostKeyChecking={'accept-new' if self.accept_host_key else 'yes'}",
            "-o",
            f"ConnectTimeout={self.connect_timeout_s}",
            "-o",
            "LogLevel=ERROR",
        ]
        if self.known_hosts is not None:
            argv += ["-o", f"UserKnownHostsFile={self.known_hosts}"]
        if self.identity is not None:
            argv += ["-i", str(self.identity), "-o", "IdentitiesOnly=yes"]
        return [*argv, "--", self.host, shlex.join(["sh", "-c", script])]


def classify(target: Target, completed: Completed) -> Completed:
    """``completed``, or the error ssh's own failure (status 255) stands for."""
    if completed.returncode != 255:
        return completed
    said = completed.errors
    where = f"{target.user}@{target.host}:{target.port}"
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in said:
        raise HostKeyRefused(
            f"the host key of {target.host} differs from the one in known_hosts: {said}",
            hint="if the machine was reinstalled, remove its old key (ssh-keygen -R HOST) and run again "
            "with --accept-host-key; otherwise someone may be intercepting the connection",
        )
    if "Host key verification failed" in said or "No host key is known" in said:
        raise HostKeyRefused(
            f"the host key of {target.host} is not in known_hosts",
            hint="check its fingerprint (ssh-keyscan on the machine itself) and run again with "
            "--accept-host-key to record it, or add it to known_hosts yourself",
        )
    raise RemoteError(
        f"cannot log in to {where}: {said or 'ssh exited with status 255'}",
        hint="check the address, the port (--port), the user (--user) and that the key (--identity or "
        "your ssh agent's) is in the user's authorized_keys",
    )


@dataclass(frozen=True)
class SshShell:
    """A shell on ``target`` through the system's ``ssh``."""

    target: Target

    @property
    def where(self) -> str:
        return self.target.host

    def run(self, script: str, data: bytes = b"", timeout_s: float = 300.0) -> Completed:
        argv = self.target.command(script)
        try:
            done = subprocess.run(argv, input=data, capture_output=True, timeout=timeout_s, check=False)
        except FileNotFoundError:
            raise RemoteError(
                f"the ssh client {self.target.program!r} is not installed on this machine",
                hint="install OpenSSH's client (Debian: apt-get install openssh-client)",
            ) from None
        except subprocess.TimeoutExpired:
            raise RemoteError(
                f"a command on {self.target.host} ran longer than {timeout_s:.0f} s",
                hint="check the machine's load and network, then run again (finished steps are kept)",
            ) from None
        return classify(self.target, Completed(done.returncode, done.stdout, done.stderr))


@dataclass(frozen=True)
class LocalShell:
    """A shell on this machine: the same scripts, without SSH."""

    where: str = "localhost"

    def run(self, script: str, data: bytes = b"", timeout_s: float = 300.0) -> Completed:
        done = subprocess.run(
            ["sh", "-c", script], input=data, capture_output=True, timeout=timeout_s, check=False
        )
        return Completed(done.returncode, done.stdout, done.stderr)


def read_file(shell: Shell, path: PurePosixPath) -> bytes | None:
    """The file at ``path`` on the shell's machine, or None when it is not there."""
    p = shlex.quote(str(path))
    done = shell.run(f"if [ -f {p} ]; then exec cat {p}; else exit {NOT_FOUND}; fi")
    if done.returncode == NOT_FOUND:
        return None
    if done.returncode != 0:
        raise RemoteError(f"cannot read {path} on {shell.where}: {done.errors}", hint="check its permissions")
    return done.stdout


def write_file(shell: Shell, path: PurePosixPath, data: bytes, mode: int = 0o644) -> bool:
    """Write ``data`` to ``path`` atomically, ``mode`` from the first byte; False if it held them already."""
    if read_file(shell, path) == data:
        return False
    p, part = shlex.quote(str(path)), shlex.quote(f"{path}.part")
    script = (
        f"set -e; umask 077; mkdir -p {shlex.quote(str(path.parent))}; cat > {part}; "
        f"chmod {mode:o} {part}; mv -f {part} {p}"
    )
    done = shell.run(script, data)
    if done.returncode != 0:
        raise RemoteError(
            f"cannot write {path} on {shell.where}: {done.errors}",
            hint="check that the directory is writable by the SSH user and the disk has room",
        )
    return True
