"""llmgw's runtime dependencies are enough: its wheel, installed without extras into a fresh virtualenv,
runs ``llmgw server run`` until it answers its health check.

No index is asked: the wheelhouse is packed from the distributions this
Python has (``llmgw.testing.installed_wheels``), only those llmgw's
``dependencies`` need, so a module the server imports from a dev-only package
fails here as on a machine that installed llmgw alone. uv makes the
virtualenv and installs (about a second with its cache in the test's folder).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from uv import find_uv_bin

from llmgw.cli.server import initialise
from llmgw.testing.cluster import free_port, wait_for
from llmgw.testing.installed_wheels import wheelhouse

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def build_wheel(out: Path) -> Path:
    """llmgw's wheel, built by setuptools from a copy of the tree (the checkout is left as it is)."""
    tree = out / "tree"
    tree.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    build = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    made = subprocess.run(
        [sys.executable, "-c", build, str(out)],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out / made.stdout.split()[-1]


def clean_environment() -> dict[str, str]:
    """This environment without what would let the installed Python see this checkout or this venv."""
    return {
        **{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")},
        "PYTHONUNBUFFERED": "1",
    }


def test_the_wheel_without_extras_installs_a_server_that_starts_answers_and_stops(tmp_path: Path) -> None:
    house = tmp_path / "wheelhouse"
    wheelhouse(PROJECT["dependencies"], house)
    wheel = build_wheel(tmp_path / "dist")
    venv, uv = tmp_path / "venv", find_uv_bin()
    uv_env = {**clean_environment(), "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
    subprocess.run(
        [uv, "venv", "-q", "--python", sys.executable, str(venv)], env=uv_env, check=True, timeout=60
    )
    subprocess.run(
        [uv, "pip", "install", "-q", "--python", str(venv / "bin/python"), "--offline", "--no-index",
         "--find-links", str(house), str(wheel)],
        env=uv_env, check=True, timeout=300,
    )  # fmt: skip

    probe = (
        "import json, llmgw; from importlib import metadata; from packaging.utils import canonicalize_name; "
        "print(json.dumps([llmgw.__file__, sorted(canonicalize_name(d.metadata['Name']) for d in "
        "metadata.distributions())]))"
    )
    where, installed = json.loads(
        subprocess.run(
            [str(venv / "bin/python"), "-c", probe],
            cwd=tmp_path, env=clean_environment(), capture_output=True, text=True, check=True, timeout=60,
        ).stdout
    )  # fmt: skip
    runtime = {canonicalize_name(Requirement(r).name) for r in PROJECT["dependencies"]}
    dev = {canonicalize_name(Requirement(r).name) for r in PROJECT["optional-dependencies"]["dev"]}
    assert where.startswith(str(venv)) and runtime <= set(installed)
    assert sorted(dev & set(installed) - runtime) == []

    home, port = tmp_path / "home", free_port()
    initialise(
        home,
        name="cp1",
        http_host="127.0.0.1",
        http_port=port,
        agent_host="127.0.0.1",
        agent_port=free_port(),
    )
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [str(venv / "bin/llmgw"), "server", "run", "--config", str(home / "server.yaml")],
            cwd=tmp_path,
            env=clean_environment(),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:

        def healthy() -> int:
            if server.poll() is not None:
                raise AssertionError(f"llmgw server run exited with {server.returncode}:\n{log.read_text()}")
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
                return int(answer.status)

        assert wait_for(healthy, 60, "the installed control plane answers /healthz") == 200
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0, log.read_text()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
