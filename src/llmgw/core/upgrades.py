"""Upgrading agents over their streams: the release a node is told to install, and its answer.

The control plane sends :class:`UpgradeAgent` with a signed release whose
files are in the mirror; the agent fetches them, verifies the signature
against its own trusted key, installs the wheel and starts again (its engines
keep serving and are adopted). It registers again with the new version, or
answers :class:`UpgradeResult` with why it did not upgrade.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReleaseFile:
    """One file of a release, in the mirror under its sha256."""

    sha256: str
    filename: str
    size: int


@dataclass(frozen=True)
class UpgradeAgent:
    """Install this release and start again on it."""

    version: str
    sums: str
    """The release's SHA256SUMS, as signed."""
    signature: str
    """SHA256SUMS.sig: the base64 of the raw ed25519 signature of ``sums``."""
    files: tuple[ReleaseFile, ...] = ()


@dataclass(frozen=True)
class UpgradeResult:
    """An agent's answer when it did not upgrade (an upgrade that worked is its new registration)."""

    version: str
    error: str
