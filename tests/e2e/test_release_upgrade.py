"""A real upgrade: a signed release verified, then installed by pip into a scratch environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.errors import UntrustedRelease
from llmgw.mirror.releases import write_release
from llmgw.mirror.upgrades import PipInstaller, upgrade
from llmgw.pki.signing import generate_signing_key
from llmgw.testing.standin_builds import fake_llmgw_wheel

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with pip and nothing else: what an upgrade installs into."""
    root = tmp_path_factory.mktemp("scratch") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=300)
    return root / "bin" / "python"


def installed_version(python: Path) -> str:
    """llmgw's version in the scratch environment alone ("-": none)."""
    code = (
        "import importlib.metadata as m\n"
        "try: print(m.version('llmgw'))\n"
        "except m.PackageNotFoundError: print('-')"
    )
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    run = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, check=True, env=environment
    )
    return run.stdout.strip()


async def test_pip_installs_a_verified_release_and_never_an_altered_one(
    scratch: Path, tmp_path: Path
) -> None:
    generate_signing_key(tmp_path / "release.key", tmp_path / "trusted.pub")
    key = (tmp_path / "trusted.pub").read_bytes()
    for version in ("9.0.0", "9.1.0"):
        (tmp_path / version).mkdir()
        wheel = fake_llmgw_wheel(tmp_path / version, version)
        write_release(tmp_path / f"release-{version}", wheel, tmp_path / "release.key")
    altered = tmp_path / "release-9.1.0" / "llmgw-9.1.0-py3-none-any.whl"
    good = altered.read_bytes()
    altered.write_bytes(good + b"\0")

    assert installed_version(scratch) == "-"
    release = await upgrade(
        str(tmp_path / "release-9.0.0"), tmp_path / "w", key, PipInstaller(str(scratch)), "0"
    )
    assert release is not None and installed_version(scratch) == "9.0.0"
    with pytest.raises(UntrustedRelease, match="was altered"):
        await upgrade(
            str(tmp_path / "release-9.1.0"), tmp_path / "w", key, PipInstaller(str(scratch)), "9.0.0"
        )
    assert installed_version(scratch) == "9.0.0"
    altered.write_bytes(good)
    await upgrade(str(tmp_path / "release-9.1.0"), tmp_path / "w", key, PipInstaller(str(scratch)), "9.0.0")
    assert installed_version(scratch) == "9.1.0"
