"""The control-plane benchmark's figures: percentiles, goals, the table and the JSON line read back.

Kept apart from ``run.py`` (which starts processes) so the arithmetic and the
JSON line it prints are tested on their own.
"""

from __future__ import annotations

import json
import math
from typing import Any

GOALS: dict[str, float] = {
    "reconcile_steady_p99_ms": 50.0,
    "reconcile_placing_ms": 50.0,
    "routing_p99_us": 200.0,
    "failover_all_registered_s": 15.0,
    "control_plane_rss_mib": 1024.0,
}
"""Each figure's ceiling (lower is better), as the benchmark's goals state them."""

UNITS = {"ms": "ms", "us": "µs", "_s": "s", "mib": "MiB"}


def percentile(values: list[float], q: float) -> float:
    """The ``q`` (0..1) percentile by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def verdicts(sizes: dict[int, dict[str, float | None]]) -> dict[str, bool | None]:
    """Whether each goal is met at the largest size measured; None when that figure was not measured."""
    if not sizes:
        return {name: None for name in GOALS}
    largest = sizes[max(sizes)]
    out: dict[str, bool | None] = {}
    for name, ceiling in GOALS.items():
        value = largest.get(name)
        out[name] = None if value is None else value <= ceiling
    return out


def growth(sizes: dict[int, dict[str, float | None]], name: str) -> float | None:
    """How many times ``name`` grew from the smallest size to the largest (None if either is missing)."""
    if len(sizes) < 2:
        return None
    first, last = sizes[min(sizes)].get(name), sizes[max(sizes)].get(name)
    if first is None or last is None or first <= 0:
        return None
    return last / first


def table(sizes: dict[int, dict[str, float | None]]) -> str:
    """One line per figure, one column per size, with its goal."""
    counts = sorted(sizes)
    lines = [f"{'figure':<28}" + "".join(f"{f'{n} nodes':>12}" for n in counts) + f"{'goal':>10}"]
    names = [n for n in GOALS] + sorted({k for s in sizes.values() for k in s} - set(GOALS))
    for name in names:
        cells = []
        for n in counts:
            value = sizes[n].get(name)
            cells.append(f"{'-' if value is None else f'{value:.4g}':>12}")
        goal = GOALS.get(name)
        lines.append(f"{name:<28}" + "".join(cells) + f"{'' if goal is None else f'≤{goal:g}':>10}")
    return "\n".join(lines)


def summary(sizes: dict[int, dict[str, float | None]], setting: dict[str, Any]) -> dict[str, Any]:
    """The JSON line's object: the figures by size, the goals, the verdicts and the growth."""
    return {
        "bench": "control-plane",
        "setting": setting,
        "sizes": {str(n): sizes[n] for n in sorted(sizes)},
        "goals": GOALS,
        "met": verdicts(sizes),
        "growth": {name: growth(sizes, name) for name in GOALS},
    }


def last_json(output: str) -> dict[str, Any]:
    """The benchmark's figures from its output: the last line that is a JSON object."""
    for line in reversed(output.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                found = json.loads(line)
            except ValueError:
                continue
            if isinstance(found, dict):
                return found
    raise ValueError("the output has no JSON line of figures: did the benchmark end early? (see its log)")
