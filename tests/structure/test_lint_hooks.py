"""pre-commit runs the checks of ``make lint``, the same commands in the same order."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def make_lint_commands() -> list[str]:
    recipe = re.search(r"^lint:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe is not None, "the Makefile has no lint target"
    return [line.strip().removeprefix("$(BIN)/") for line in recipe.group(1).splitlines()]


def test_pre_commit_hooks_run_make_lints_commands() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    assert [hook["entry"].removeprefix(".venv/bin/") for hook in hooks] == make_lint_commands()
    assert all(hook["language"] == "system" and hook["pass_filenames"] is False for hook in hooks)


def test_make_lint_checks_the_format_and_types_everything() -> None:
    commands = make_lint_commands()
    assert "ruff format --check src tests bench" in commands and "mypy src" in commands


def test_mypy_is_strict_for_all_of_src() -> None:
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["strict"] is True
    loosened = [o["module"] for o in mypy.get("overrides", []) if set(o) - {"module", "ignore_errors"}]
    ignored = [o["module"] for o in mypy.get("overrides", []) if o.get("ignore_errors")]
    assert not loosened and ignored == [["llmgw.protocol.agent_pb2", "llmgw.protocol.agent_pb2_grpc"]]
