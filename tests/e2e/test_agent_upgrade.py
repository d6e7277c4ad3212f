"""An agent upgraded over its stream for real: its own environment, pip, a restart, the new version.

The agent runs from a scratch virtualenv holding llmgw's wheel of this tree (its dependencies seen
through a .pth file), so the upgrade's pip touches nothing else. The release is the same code
claiming the next version; the agent must fetch it from the mirror over gRPC, verify it against
its own trusted.pub, install it, start again (same pid) and register with the new version.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw import __version__
from llmgw.mirror.releases import write_release
from llmgw.pki.signing import generate_signing_key
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.standin_builds import relabel_wheel

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
NEXT = __version__ + ".post1"


def clean_environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the python of a virtualenv holding this tree's llmgw, this tree's wheel)."""
    work = tmp_path_factory.mktemp("agent-upgrade")
    tree = work / "tree"
    tree.mkdir()
    shutil.copy(ROOT / "pyproject.toml", tree)
    shutil.copy(ROOT / "README.md", tree)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
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
            str(work),
            str(tree),
        ],
        check=True,
        timeout=300,
        env=clean_environment(),
    )
    wheel = next(work.glob("llmgw-*.whl"))
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "llmgw-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
        check=True,
        timeout=300,
        env=clean_environment(),
    )
    return python, wheel


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(home=tmp_path / "cluster", cache_dir=tmp_path / "cache") as running:
        yield running


def test_an_agent_upgrades_over_its_stream(
    scratch: tuple[Path, Path], cluster: Cluster, tmp_path: Path
) -> None:
    python, wheel = scratch
    generate_signing_key(tmp_path / "release.key", tmp_path / "trusted.pub")
    shutil.copy(tmp_path / "trusted.pub", cluster.home / "trusted.pub")
    (tmp_path / "next").mkdir()
    release = tmp_path / "release"
    write_release(release, relabel_wheel(wheel, NEXT, tmp_path / "next"), tmp_path / "release.key")

    cluster.start_server()
    config = cluster.add_node("n1")
    shutil.copy(tmp_path / "trusted.pub", config.parent / "trusted.pub")
    log = cluster.log("agent-n1")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        cluster.processes["agent-n1"] = subprocess.Popen(
            [str(python), "-m", "llmgw.cli.main", "agent", "run", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**clean_environment(), "PYTHONUNBUFFERED": "1"},
        )
    pid = cluster.processes["agent-n1"].pid
    wait_for(lambda: [n for n in cluster.admin.nodes() if n.id == "n1" and n.connected], 60, "n1 registers")

    for name in sorted(p.name for p in release.iterdir()):
        cluster.upload(release / name)
    body = {
        "sums": (release / "SHA256SUMS").read_text(),
        "signature": (release / "SHA256SUMS.sig").read_text(),
    }
    started = cluster.admin.request("POST", "/api/upgrades/agents", body)
    assert started["version"] == NEXT and started["nodes"] == ["n1"]

    def finished() -> dict[str, object] | None:
        state = cluster.admin.get("/api/upgrades/agents")
        return state if state["finished"] else None

    try:
        state = wait_for(finished, 240, "the rollout ends")
    except Exception:
        print(cluster.tails())
        raise
    assert state["error"] == "" and state["upgraded"] == ["n1"], cluster.tails()
    assert cluster.processes["agent-n1"].pid == pid and cluster.processes["agent-n1"].poll() is None
    installed = subprocess.run(
        [str(python), "-c", "import llmgw; print(llmgw.__version__)"],
        capture_output=True,
        text=True,
        check=True,
        env=clean_environment(),
    ).stdout.strip()
    assert installed == NEXT
