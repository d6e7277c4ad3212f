import asyncio
import stat
from pathlib import Path

import pytest

from llmgw.errors import LlmgwError, UntrustedRelease
from llmgw.mirror.releases import write_release
from llmgw.mirror.upgrades import PipInstaller, upgrade
from llmgw.pki.signing import generate_signing_key


class RecordingInstaller:
    def __init__(self) -> None:
        self.installed: list[bytes] = []

    async def install(self, wheel: Path) -> None:
        self.installed.append(await asyncio.to_thread(wheel.read_bytes))


@pytest.fixture
def signed(tmp_path: Path) -> tuple[Path, bytes]:
    generate_signing_key(tmp_path / "release.key", tmp_path / "trusted.pub")
    wheel = tmp_path / "llmgw-9.9.9-py3-none-any.whl"
    wheel.write_bytes(b"new version")
    write_release(tmp_path / "release", wheel, tmp_path / "release.key")
    return tmp_path / "release", (tmp_path / "trusted.pub").read_bytes()


async def test_a_verified_release_is_installed(signed: tuple[Path, bytes], tmp_path: Path) -> None:
    installer = RecordingInstaller()
    release = await upgrade(str(signed[0]), tmp_path / "work", signed[1], installer, running="0.1.0")
    assert release is not None and release.version == "9.9.9"
    assert installer.installed == [b"new version"]


async def test_the_version_already_running_installs_nothing(
    signed: tuple[Path, bytes], tmp_path: Path
) -> None:
    installer = RecordingInstaller()
    assert await upgrade(str(signed[0]), tmp_path / "work", signed[1], installer, running="9.9.9") is None
    assert installer.installed == []


async def test_an_altered_release_is_never_installed(signed: tuple[Path, bytes], tmp_path: Path) -> None:
    (signed[0] / "llmgw-9.9.9-py3-none-any.whl").write_bytes(b"new versioN")
    installer = RecordingInstaller()
    with pytest.raises(UntrustedRelease, match="was altered"):
        await upgrade(str(signed[0]), tmp_path / "work", signed[1], installer, running="0.1.0")
    assert installer.installed == []


async def test_pip_failing_says_why(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\necho "ERROR: No matching distribution found for missing-dep"\nexit 1\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(LlmgwError, match="missing-dep") as failed:
        await PipInstaller(str(python)).install(tmp_path / "llmgw-9.9.9-py3-none-any.whl")
    assert "exit 1" in failed.value.message and failed.value.hint


async def test_pip_is_given_the_wheel(tmp_path: Path) -> None:
    python = tmp_path / "python"
    log = tmp_path / "args"
    python.write_text(f'#!/bin/sh\necho "$@" > {log}\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    await PipInstaller(str(python)).install(tmp_path / "llmgw-9.9.9-py3-none-any.whl")
    args = log.read_text().split()
    assert args[:3] == ["-m", "pip", "install"] and args[-1].endswith("llmgw-9.9.9-py3-none-any.whl")
