"""The control-plane benchmark's figures (percentiles, goals, growth, the JSON line read back) and a
smoke run of the benchmark itself: 10 simulated nodes, 5 models, in process."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "control_plane"
_SPEC = importlib.util.spec_from_file_location("bench_control_plane_figures", _BENCH / "figures.py")
assert _SPEC is not None and _SPEC.loader is not None
figures = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = figures
_SPEC.loader.exec_module(figures)


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(n) for n in range(1, 101)]
    assert figures.percentile(values, 0.5) == 50.0
    assert figures.percentile(values, 0.99) == 99.0
    assert figures.percentile(list(reversed(values)), 1.0) == 100.0
    assert figures.percentile([7.0], 0.99) == 7.0
    assert figures.percentile([], 0.5) == 0.0


def test_goals_are_judged_at_the_largest_size() -> None:
    sizes = {
        100: {"reconcile_steady_p99_ms": 90.0, "routing_p99_us": 100.0},
        1000: {"reconcile_steady_p99_ms": 40.0, "routing_p99_us": 250.0, "failover_all_registered_s": None},
    }
    met = figures.verdicts(sizes)
    assert met["reconcile_steady_p99_ms"] is True
    assert met["routing_p99_us"] is False
    assert met["failover_all_registered_s"] is None  # not measured: neither met nor missed
    assert met["control_plane_rss_mib"] is None


def test_growth_is_largest_over_smallest() -> None:
    sizes = {100: {"reconcile_placing_ms": 200.0}, 300: {"reconcile_placing_ms": 500.0},
             1000: {"reconcile_placing_ms": 2000.0}}  # fmt: skip
    assert figures.growth(sizes, "reconcile_placing_ms") == 10.0
    assert figures.growth(sizes, "routing_p99_us") is None
    assert figures.growth({100: {"reconcile_placing_ms": 1.0}}, "reconcile_placing_ms") is None


def test_the_json_line_is_read_back_from_the_output() -> None:
    sizes = {100: {"routing_p99_us": 120.0}}
    line = json.dumps(figures.summary(sizes, {"models": 500}))
    output = f"100 nodes: in process\n  routing_p99_us 120.0\n{{not json\n{line}\n"
    found = figures.last_json(output)
    assert found["sizes"]["100"]["routing_p99_us"] == 120.0
    assert found["met"]["routing_p99_us"] is True
    assert found["goals"]["reconcile_steady_p99_ms"] == 50.0
    with pytest.raises(ValueError, match="no JSON line"):
        figures.last_json("started\nfailed: Traceback\n")


def test_the_table_has_a_column_per_size_and_the_goals() -> None:
    text = figures.table({100: {"routing_p99_us": 120.0}, 300: {"routing_p99_us": 130.0}})
    header, *rows = text.splitlines()
    assert "100 nodes" in header and "300 nodes" in header
    routing = next(row for row in rows if row.startswith("routing_p99_us"))
    assert routing.split() == ["routing_p99_us", "120", "130", "≤200"]


def test_a_smoke_run_places_every_model_and_prints_its_figures() -> None:
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    run = subprocess.run(
        [sys.executable, str(_BENCH / "run.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    found = figures.last_json(run.stdout)
    smoke = found["sizes"]["10"]
    assert smoke["replicas_placed"] == smoke["replicas_wanted"] == 10  # 4 of the wide model, 6 of the others
    assert smoke["routing_replicas"] == 4
    assert smoke["reconcile_placing_ms"] > 0 and smoke["reconcile_steady_p99_ms"] > 0
    assert found["met"]["failover_all_registered_s"] is None  # the smoke run starts no processes
