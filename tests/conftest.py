"""Suite-wide: under CI=true a skip for a missing real component fails (``llmgw.testing.components``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llmgw.testing.components import MISSING, in_ci


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if not (report.skipped and in_ci()) or not isinstance(report.longrepr, tuple):
        return
    reason = str(report.longrepr[2]).removeprefix("Skipped: ")
    if reason.startswith(MISSING):
        report.outcome = "failed"
        report.longrepr = f"{reason} (CI=true: a component the Makefile installs must be here)"
