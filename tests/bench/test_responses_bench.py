"""The kept responses benchmark runs end to end and ends with its JSON line of figures."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "responses" / "run.py"
_SPEC = importlib.util.spec_from_file_location("bench_responses_run", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench
_SPEC.loader.exec_module(bench)


def test_a_short_run_prints_both_books_figures_and_their_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    figures = bench.main(["--requests", "20"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == figures
    for kind in ("plain", "follow_up"):
        row = figures[kind]
        assert row["memory"]["p50_ms"] > 0 and row["store"]["p50_ms"] > 0
        assert row["ratio_p50"] == round(row["store"]["p50_ms"] / row["memory"]["p50_ms"], 3)
    assert figures["store"] == "sqlite" and figures["rows_kept"] > 0
