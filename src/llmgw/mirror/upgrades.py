"""Upgrading llmgw from a signed release: obtain it, verify it, install its wheel.

A release comes from a directory or an address (https, or http to this
machine); it is verified against the trusted key before its wheel is handed
to the installer, which for a real machine is pip in the running
environment (:class:`PipInstaller`). Tests hand in an installer of their own.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Protocol

from llmgw import __version__
from llmgw.errors import LlmgwError
from llmgw.mirror.releases import Release, fetch_release, verify_release

INSTALL_OUTPUT_MAX = 4000
"""Characters of pip's output kept in the error when it fails."""


class WheelInstaller(Protocol):
    async def install(self, wheel: Path) -> None:
        """Install ``wheel`` into the environment llmgw runs from; LlmgwError saying why when it cannot."""
        ...


class PipInstaller:
    """Installs a wheel with ``<python> -m pip install`` (the running interpreter's, unless told)."""

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python

    def command(self, wheel: Path) -> list[str]:
        # dependencies already met are kept (no index is asked for them), so an offline node upgrades
        return [self.python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", str(wheel)]

    async def install(self, wheel: Path) -> None:
        # pip sees the target environment alone: a PYTHONPATH would show it packages from elsewhere
        environment = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
        process = await asyncio.create_subprocess_exec(
            *self.command(wheel),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=environment,
        )
        output, _ = await process.communicate()
        if process.returncode != 0:
            tail = output.decode(errors="replace")[-INSTALL_OUTPUT_MAX:]
            raise LlmgwError(
                f"pip could not install {wheel.name} (exit {process.returncode}): {tail.strip()}",
                hint="a dependency the new version needs may be missing offline: install it from a "
                "wheelhouse, then run the upgrade again",
            )


def is_address(source: str) -> bool:
    """Whether ``source`` names a release by address (``scheme://...``) rather than a directory."""
    return "://" in source


async def obtain_release(source: str, work: Path, trusted_public_key: bytes) -> Release:
    """The verified release at ``source``: a directory checked in place, or an address fetched to ``work``."""
    if is_address(source):
        return await fetch_release(source, work, trusted_public_key)
    return await asyncio.to_thread(verify_release, Path(source), trusted_public_key)


async def upgrade(
    source: str,
    work: Path,
    trusted_public_key: bytes,
    installer: WheelInstaller,
    running: str = __version__,
) -> Release | None:
    """Verify the release at ``source`` and install it; None when this version already runs."""
    release = await obtain_release(source, work, trusted_public_key)
    if release.version == running:
        return None
    await installer.install(release.wheel)
    return release
