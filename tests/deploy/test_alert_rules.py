"""The Prometheus rules are valid (promtool check rules) and every alert has a unit test that fires it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from .conftest import RULE_TESTS, RULES


def alerts_of(path: Path) -> set[str]:
    groups = yaml.safe_load(path.read_text())["groups"]
    return {rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule}


def fired_in(path: Path) -> set[str]:
    """Alerts a promtool test file expects firing at least once."""
    return {
        check["alertname"]
        for test in yaml.safe_load(path.read_text())["tests"]
        for check in test.get("alert_rule_test", [])
        if check.get("exp_alerts")
    }


@pytest.mark.parametrize("path", RULES, ids=lambda p: p.name)
def test_rules_file_is_valid(promtool: str, path: Path) -> None:
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", RULE_TESTS, ids=lambda p: p.name)
def test_rule_unit_tests_pass(promtool: str, path: Path) -> None:
    result = subprocess.run(
        [promtool, "test", "rules", path.name], cwd=path.parent, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_test_that_fires_it() -> None:
    defined = set().union(*(alerts_of(p) for p in RULES))
    fired = set().union(*(fired_in(p) for p in RULE_TESTS))
    assert defined - fired == set()
    assert len(defined) >= 15


def test_every_rules_file_is_tested() -> None:
    tested = {
        (path.parent / rule_file).resolve()
        for path in RULE_TESTS
        for rule_file in yaml.safe_load(path.read_text())["rule_files"]
    }
    assert set(RULES) <= tested


def test_a_failing_rule_test_is_reported(promtool: str, tmp_path: Path) -> None:
    """The unit tests above would catch a rule that does not fire: promtool fails such a test."""
    (tmp_path / "rules.yaml").write_text(
        "groups: [{name: g, rules: [{alert: Never, expr: vector(1) == 2}]}]\n"
    )
    (tmp_path / "test.yaml").write_text(
        "rule_files: [rules.yaml]\n"
        "tests:\n"
        "  - interval: 1m\n"
        "    alert_rule_test:\n"
        "      - {eval_time: 1m, alertname: Never, exp_alerts: [{exp_labels: {}}]}\n"
    )
    result = subprocess.run(
        [promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
