"""Tools the deployment files are checked with: promtool (Debian's prometheus), hadolint, Helm's SDK."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RULES = sorted((DEPLOY / "prometheus" / "rules").glob("*.yaml"))
RULE_TESTS = sorted((DEPLOY / "prometheus" / "tests").glob("*.yaml"))


def tool(name: str, install: str) -> str:
    """The path of ``name`` (on PATH or beside this Python), or a failure saying how to install it."""
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        pytest.fail(f"{name} is not installed: {install}")
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    return tool("promtool", "run 'make prometheus' (apt-get install prometheus)")


@pytest.fixture(scope="session")
def prometheus() -> str:
    return tool("prometheus", "run 'make prometheus' (apt-get install prometheus)")


def dashboards_module() -> ModuleType:
    """deploy/grafana/generate.py, which defines the dashboards."""
    spec = importlib.util.spec_from_file_location("llmgw_dashboards", DEPLOY / "grafana" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
