"""The agent's side of ``ctl upgrade agents``: fetch, verify against its own key, install, restart."""

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.agent.upgrading import AgentUpgrader
from llmgw.core.upgrades import ReleaseFile, UpgradeAgent, UpgradeResult
from llmgw.mirror.releases import SIGNATURE, SUMS, write_release
from llmgw.pki.signing import generate_signing_key

WHEEL = "llmgw-2.0.0-py3-none-any.whl"


class RecordingInstaller:
    def __init__(self) -> None:
        self.installed: list[bytes] = []

    async def install(self, wheel: Path) -> None:
        self.installed.append(await asyncio.to_thread(wheel.read_bytes))


class Node:
    """An agent's upgrader with a mirror of ``blobs``, its installer, restarts and reports recorded."""

    def __init__(self, tmp_path: Path, trusted_pub: Path, blobs: dict[str, bytes]) -> None:
        self.blobs = blobs
        self.fetched: list[str] = []
        self.installer = RecordingInstaller()
        self.restarts: list[str] = []
        self.reports: list[UpgradeResult] = []
        self.upgrader = AgentUpgrader(
            tmp_path / "work",
            trusted_pub,
            lambda: self.fetch,
            self.installer,
            self.restarts.append,
            self.reports.append,
            running="1.0.0",
        )

    async def fetch(self, sha256: str, offset: int) -> AsyncIterator[bytes]:
        self.fetched.append(sha256)
        yield self.blobs[sha256][offset:]


@pytest.fixture
def release(tmp_path: Path) -> UpgradeAgent:
    generate_signing_key(tmp_path / "release.key", tmp_path / "trusted.pub")
    (tmp_path / WHEEL).write_bytes(b"version two")
    made = write_release(tmp_path / "release", tmp_path / WHEEL, tmp_path / "release.key")
    return UpgradeAgent(
        version="2.0.0",
        sums=(tmp_path / "release" / SUMS).read_text(),
        signature=(tmp_path / "release" / SIGNATURE).read_text(),
        files=(ReleaseFile(made.sha256, WHEEL, len(b"version two")),),
    )


async def test_a_signed_release_is_fetched_installed_and_the_agent_restarts(
    release: UpgradeAgent, tmp_path: Path
) -> None:
    node = Node(tmp_path, tmp_path / "trusted.pub", {release.files[0].sha256: b"version two"})
    await node.upgrader.upgrade(release)
    assert node.installer.installed == [b"version two"]
    assert node.restarts == ["upgraded to llmgw 2.0.0"]
    assert node.reports == []


async def test_a_release_signed_by_a_key_the_node_does_not_trust_fetches_nothing(
    release: UpgradeAgent, tmp_path: Path
) -> None:
    generate_signing_key(tmp_path / "other.key", tmp_path / "other.pub")
    node = Node(tmp_path, tmp_path / "other.pub", {release.files[0].sha256: b"version two"})
    await node.upgrader.upgrade(release)
    assert node.fetched == [] and node.installer.installed == [] and node.restarts == []
    assert [r.version for r in node.reports] == ["2.0.0"]
    assert "does not trust" in node.reports[0].error


async def test_an_unsigned_release_is_refused(release: UpgradeAgent, tmp_path: Path) -> None:
    node = Node(tmp_path, tmp_path / "trusted.pub", {release.files[0].sha256: b"version two"})
    await node.upgrader.upgrade(UpgradeAgent("2.0.0", release.sums, "", release.files))
    assert node.installer.installed == [] and node.restarts == []
    assert "not signed" in node.reports[0].error


async def test_altered_sums_are_refused(release: UpgradeAgent, tmp_path: Path) -> None:
    altered_wheel = b"version 2!!"
    sums = release.sums.replace(release.files[0].sha256, "0" * 64)
    node = Node(tmp_path, tmp_path / "trusted.pub", {"0" * 64: altered_wheel})
    files = (ReleaseFile("0" * 64, WHEEL, len(altered_wheel)),)
    await node.upgrader.upgrade(UpgradeAgent("2.0.0", sums, release.signature, files))
    assert node.fetched == [] and node.installer.installed == []
    assert "signature does not match" in node.reports[0].error


async def test_altered_bytes_from_the_mirror_are_never_installed(
    release: UpgradeAgent, tmp_path: Path
) -> None:
    node = Node(tmp_path, tmp_path / "trusted.pub", {release.files[0].sha256: b"version 2!!"})
    await node.upgrader.upgrade(release)
    assert node.installer.installed == [] and node.restarts == []
    assert "sha256" in node.reports[0].error


async def test_the_version_running_already_is_left_alone(release: UpgradeAgent, tmp_path: Path) -> None:
    node = Node(tmp_path, tmp_path / "trusted.pub", {})
    await node.upgrader.upgrade(UpgradeAgent("1.0.0", release.sums, release.signature, release.files))
    assert node.fetched == [] and node.restarts == [] and node.reports == []
