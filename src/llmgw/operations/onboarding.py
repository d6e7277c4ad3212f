"""Onboarding a machine over a :class:`~llmgw.operations.remote.Shell`, step by step, idempotently.

``llmgw node add`` and ``llmgw server add`` run the same steps: connect,
install (a signed release, checked again on the machine with the cluster's
``trusted.pub``), the engine user, the certificate, the configuration, the
service, then a wait for the machine to show up in the cluster. Each step
looks at what the machine has before changing anything and reports
``changed`` or ``unchanged``, so a second run changes nothing and says so;
a step that fails raises :class:`StepFailed` naming it, with what to do.

What llmgw itself decides (which release, the certificate, agent.yaml) is
handed in as a :class:`Plan` by the command, which knows the cluster; this
module only knows the machine.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from llmgw.errors import LlmgwError
from llmgw.operations.remote import Shell, read_file, write_file

ENGINE_USER = "llmgw-engine"
ENGINE_GROUPS = ("video", "render")
ROOT = PurePosixPath("/")


class StepFailed(LlmgwError):
    """A step of onboarding failed; the message names the machine and the step."""

    def __init__(self, where: str, step: str, message: str, hint: str) -> None:
        super().__init__(f"{where}: step '{step}' failed: {message}", hint)
        self.step = step


@dataclass(frozen=True)
class Layout:
    """Where llmgw lives on the machine; ``root`` moves all of it (tests keep it in a directory)."""

    root: PurePosixPath = ROOT

    @property
    def venv(self) -> PurePosixPath:
        return self.root / "opt/llmgw"

    @property
    def config_dir(self) -> PurePosixPath:
        return self.root / "etc/llmgw"

    @property
    def state_dir(self) -> PurePosixPath:
        return self.root / "var/lib/llmgw"

    @property
    def marker(self) -> PurePosixPath:
        """The release installed in the venv: ``<version> <wheel sha256>``."""
        return self.venv / "RELEASE"

    @property
    def llmgw(self) -> PurePosixPath:
        return self.venv / "bin/llmgw"

    def releases(self, version: str) -> PurePosixPath:
        return self.state_dir / "releases" / version


@dataclass(frozen=True)
class ReleaseFiles:
    """A release verified on this machine, to install there: its files and the key that checked them."""

    version: str
    wheel: str
    """The wheel's file name."""
    sha256: str
    files: dict[str, bytes]
    """The wheel, ``SHA256SUMS`` and ``SHA256SUMS.sig``."""
    trusted_pub: bytes

    @property
    def marker(self) -> bytes:
        return f"{self.version} {self.sha256}\n".encode()


@dataclass(frozen=True)
class Installer:
    """How the release's wheel goes into the machine's venv.

    Production (``installed_deps`` False): ``python -m venv`` and pip installs
    the wheel with its dependencies (from the machine's package index).
    ``installed_deps``: the venv sees the packages of ``python``'s own
    environment (``--system-site-packages``, and that environment's
    site-packages when ``python`` is itself a venv's), the wheel goes in with
    ``--no-deps``, and importing the agent and the server checks that every
    dependency is there.
    """

    python: str = "python3"
    installed_deps: bool = False


@dataclass(frozen=True)
class Service:
    """A long-running llmgw process on the machine: a systemd unit, or a detached process without systemd."""

    name: str
    """The unit's name (``llmgw-agent``)."""
    arguments: tuple[str, ...]
    """What follows ``llmgw`` (``agent run --config ...``)."""
    description: str


@dataclass(frozen=True)
class Plan:
    """What the machine should end up with; ``files`` are written into the config directory."""

    release: ReleaseFiles
    files: dict[str, tuple[bytes, int]]
    """Configuration by file name: bytes and mode (agent.yaml, ca.crt, ...)."""
    certificate: str
    """The file name of the machine's certificate (``node.crt``)."""
    certificate_fits: Callable[[bytes], bool]
    """Whether the certificate the machine holds can stay."""
    issue: Callable[[], dict[str, tuple[bytes, int]]]
    """A new certificate and key (and the CA's certificate), by file name."""
    service: Service
    joined: Callable[[], bool]
    """Whether the cluster sees the machine (asked until it does, or the timeout)."""
    joined_what: str
    engine_user: bool = True
    """Whether the machine gets the engines' user (nodes do, control planes do not)."""
    join_hint: str = ""
    """Said, besides the service's log, when the machine does not join."""
    checks: tuple[tuple[str, Callable[[Onboarding], str]], ...] = ()
    """Steps of the command's own, run after connecting and before anything changes (named, like every
    step, in their errors): what would refuse the machine is found before it is half set up."""


Report = Callable[[str, str], None]
"""Told each step's name and what it did."""


@dataclass
class Onboarding:
    """The steps, run against one machine's shell."""

    shell: Shell
    report: Report
    layout: Layout = field(default_factory=Layout)
    installer: Installer = field(default_factory=Installer)
    join_timeout_s: float = 120.0
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    systemd: bool = False
    """Whether systemd runs the machine (found by the connect step)."""
    changed: list[str] = field(default_factory=list)
    """The steps of this run that changed something."""

    def fail(self, step: str, message: str, hint: str) -> StepFailed:
        return StepFailed(self.shell.where, step, message, hint)

    def sh(self, step: str, script: str, hint: str, data: bytes = b"") -> str:
        """Run ``script`` for ``step``; its output, or StepFailed with its errors."""
        done = self.shell.run(script, data)
        if done.returncode != 0:
            said = done.errors or done.text.strip() or f"exit status {done.returncode}"
            raise self.fail(step, said, hint)
        return done.text

    def read(self, path: PurePosixPath) -> bytes | None:
        return read_file(self.shell, path)

    def write(self, path: PurePosixPath, data: bytes, mode: int = 0o644) -> bool:
        return write_file(self.shell, path, data, mode)


def quote(path: PurePosixPath | str) -> str:
    return shlex.quote(str(path))
