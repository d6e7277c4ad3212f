"""The mirror benchmark's figures: rates, ratios, goals and the JSON line read back."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "mirror" / "figures.py"
_SPEC = importlib.util.spec_from_file_location("bench_mirror_figures", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
figures = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = figures
_SPEC.loader.exec_module(figures)

GIB = 1 << 30


def timings(**changed: float) -> object:
    given = dict(
        size=2 * GIB,
        sha256sum_s=4.0,
        cp_s=2.0,
        cp_sync_s=4.0,
        import_s=5.0,
        fetch_s=6.0,
        import_rss=40e6,
        fetch_rss=120e6,
        server_rss=90e6,
    )
    given.update(changed)
    return figures.Timings(**{k: int(v) if k.endswith(("rss", "size")) else v for k, v in given.items()})


def test_rates_ratios_and_goals() -> None:
    out = figures.figures(timings())
    assert out["sha256sum_mb_s"] == round(2 * GIB / 1e6 / 4.0, 1)
    assert out["import_vs_sha256sum"] == 0.8
    assert out["fetch_vs_cp"] == round(2 / 6, 3)
    assert out["fetch_vs_cp_sync"] == round(4 / 6, 3)
    assert out["goals"] == {"import": True, "fetch": False, "fetch_durable": True, "memory": True}


def test_a_process_holding_much_of_the_file_misses_the_memory_goal() -> None:
    assert figures.figures(timings(fetch_rss=1.2e9))["goals"]["memory"] is False


def test_the_json_line_is_read_back_from_a_runs_output() -> None:
    line = figures.json_line(timings())
    output = f"sha256sum 537 MB/s\nimport ...\n{line}\n"
    assert figures.read_json_line(output) == json.loads(line)
    with pytest.raises(ValueError, match="no JSON line"):
        figures.read_json_line("sha256sum 537 MB/s\n")
