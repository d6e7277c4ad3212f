"""What ``make unit`` installs first: the virtualenv and the few Debian tools unit tests run, nothing more."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def prerequisites(target: str) -> set[str]:
    make = shutil.which("make")
    if make is None:
        pytest.fail("make is not installed: apt-get install make")
    database = subprocess.run(
        [make, "-pnq", "-C", str(ROOT), target], capture_output=True, text=True, timeout=60
    ).stdout
    (line,) = [line for line in database.splitlines() if line.startswith(f"{target}:")]
    return set(line.split(":", 1)[1].split())


def test_unit_needs_only_the_venv_postgres_promtool_systemd_analyze_and_nginx() -> None:
    assert prerequisites("unit") == {"install", "postgres", "prometheus", "systemd", "wrk"}


def test_the_whole_suite_still_installs_what_end_to_end_tests_need() -> None:
    assert {
        "chromium",
        "opstools",
        "sshd",
        "patroni",
        "postgres",
        "prometheus",
        "wrk",
        "lint",
    } <= prerequisites("test")
    assert {"chromium", "opstools", "sshd", "patroni", "engine", "vllm", "ray"} <= prerequisites("e2e")
