"""A machine being set up over SSH: how to reach it, the release it gets, and running the steps.

:class:`Machine` is what every ``add`` shares (SSH target, layout,
installer, release, join timeout); :func:`release_files` checks a signed
release here before any step runs there; :func:`run_onboarding` runs the
steps of :mod:`llmgw.operations.steps`, telling each to a ``report``
callable, and lets a failed step's :class:`~llmgw.errors.LlmgwError`
through to the caller, which says it (the command line, the console).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from packaging.version import InvalidVersion, Version

from llmgw.controlplane.config import ServerConfig
from llmgw.errors import ConfigError, UntrustedRelease
from llmgw.mirror.releases import SIGNATURE, SUMS, Release, fetch_release, read_trusted_key, verify_release
from llmgw.operations.onboarding import Installer, Layout, Onboarding, Plan, ReleaseFiles, Report, StepFailed
from llmgw.operations.remote import SshShell, Target
from llmgw.operations.steps import onboard

SSH_USER = "root"
"""Who to log in as: root, since onboarding creates users and services."""
SSH_PORT = 22
ACCEPT_HOST_KEY = False
"""Record the host key of a machine not yet in known_hosts: no, unless asked."""
RELEASE = ""
"""The release to install: none named, so the newest one in the control plane's mirror."""
PYTHON = "python3"
"""The Python on the machine that makes llmgw's venv."""
INSTALLED_DEPS = False
"""Take the dependencies from that Python's environment (pip --no-deps) instead of the index: no."""
ROOT = "/"
"""Where /opt, /etc and /var/lib are on the machine (another directory in tests)."""
JOIN_TIMEOUT_S = 120.0
"""Seconds to wait for the machine to join the cluster."""


@dataclass(frozen=True)
class Machine:
    """The SSH and install options every ``add`` shares."""

    target: Target
    layout: Layout
    installer: Installer
    release: str
    timeout_s: float


def machine_over_ssh(
    host: str,
    user: str,
    port: int,
    identity: Path | None,
    known_hosts: Path | None,
    accept_host_key: bool,
    release: str,
    python: str,
    installed_deps: bool,
    root: str,
    timeout_s: float,
) -> Machine:
    target = Target(host, user, port, identity, known_hosts, accept_host_key)
    return Machine(target, Layout(PurePosixPath(root)), Installer(python, installed_deps), release, timeout_s)


def release_files(config: ServerConfig, source: str, scratch: Path) -> ReleaseFiles:
    """The release at ``source`` (directory, address, or ``mirror``), verified here with the cluster's
    trusted.pub."""
    trusted = read_trusted_key(config.path(config.release.trusted_pub))
    if not source or source == MIRROR:
        kept = mirrored_releases(config)
        if not kept:
            raise StepFailed(
                "this machine",
                "install",
                "no release given, and this control plane's mirror holds none",
                "give --release with a signed release's directory or https address "
                "('make release KEY=...' makes one), or import an offline bundle ('llmgw bundle import')",
            )
        source = str(kept[-1])
    try:
        if source.startswith(("http://", "https://")):
            release: Release = asyncio.run(fetch_release(source, scratch, trusted))
        else:
            release = verify_release(Path(source), trusted)
    except (UntrustedRelease, ConfigError) as error:
        raise StepFailed("this machine", "install", error.message, error.hint) from error
    directory = release.wheel.parent
    files = {name: (directory / name).read_bytes() for name in (release.wheel.name, SUMS, SIGNATURE)}
    return ReleaseFiles(release.version, release.wheel.name, release.sha256, files, trusted)


MIRROR = "mirror"
"""``--release mirror``: the newest release held in this control plane's mirror."""


def mirrored_releases(config: ServerConfig) -> list[Path]:
    """The release folders an offline bundle put into this control plane's mirror, oldest version first."""
    root = config.data_path / "mirror" / "releases"
    found = [folder for folder in root.iterdir() if (folder / SUMS).is_file()] if root.is_dir() else []

    def version(folder: Path) -> Version:
        try:
            return Version(folder.name)
        except InvalidVersion:
            return Version("0")

    return sorted(found, key=version)


def run_onboarding(machine: Machine, plan_of: Callable[[], Plan], report: Report) -> list[str]:
    """Run the steps on ``machine``, telling each to ``report``: the names of what changed.

    A failed step raises its :class:`~llmgw.errors.LlmgwError` (which step, what to do)."""
    shell = SshShell(machine.target)
    ctx = Onboarding(shell, report, machine.layout, machine.installer, join_timeout_s=machine.timeout_s)
    return onboard(ctx, plan_of())
