"""The mirror benchmark's figures: rates, ratios to the tools' own, and whether the goals are met.

Kept apart from ``run.py`` (which starts processes) so the arithmetic and the
JSON line it prints are tested on their own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MB = 10**6
IMPORT_GOAL = 0.7
"""Import at least 0.7 x sha256sum's rate (it hashes and copies; sha256sum only hashes)."""
FETCH_GOAL = 0.5
"""A node's fetch at least 0.5 x cp's rate (it crosses gRPC with TLS and hashes on the way)."""
RSS_GOAL_BYTES = 256 * MB
"""Flat memory: no process's peak RSS above 256 MB, whatever the file's size (nothing holds it whole;
an idle process with gRPC loaded holds about 60 MB)."""


@dataclass(frozen=True)
class Timings:
    """Seconds each step took for one file of ``size`` bytes, and peak RSS (bytes) of our processes."""

    size: int
    sha256sum_s: float
    cp_s: float
    cp_sync_s: float
    import_s: float
    fetch_s: float
    import_rss: int
    fetch_rss: int
    server_rss: int


def rate(size: int, seconds: float) -> float:
    """MB/s (10^6 bytes a second)."""
    return size / MB / seconds if seconds > 0 else float("inf")


def figures(t: Timings) -> dict[str, Any]:
    """Every figure the JSON line carries, rounded for reading."""
    sha256sum = rate(t.size, t.sha256sum_s)
    cp = rate(t.size, t.cp_s)
    imported = rate(t.size, t.import_s)
    fetched = rate(t.size, t.fetch_s)
    peak = max(t.import_rss, t.fetch_rss, t.server_rss)
    out: dict[str, Any] = {
        "size_bytes": t.size,
        "sha256sum_mb_s": round(sha256sum, 1),
        "cp_mb_s": round(cp, 1),
        "cp_sync_mb_s": round(rate(t.size, t.cp_sync_s), 1),
        "import_mb_s": round(imported, 1),
        "fetch_mb_s": round(fetched, 1),
        "import_vs_sha256sum": round(imported / sha256sum, 3),
        "fetch_vs_cp": round(fetched / cp, 3),
        "fetch_vs_cp_sync": round(fetched / rate(t.size, t.cp_sync_s), 3),
        "import_peak_rss_mb": round(t.import_rss / MB, 1),
        "fetch_peak_rss_mb": round(t.fetch_rss / MB, 1),
        "server_peak_rss_mb": round(t.server_rss / MB, 1),
    }
    out["goals"] = {
        "import": imported >= IMPORT_GOAL * sha256sum,
        "fetch": fetched >= FETCH_GOAL * cp,
        "fetch_durable": fetched >= FETCH_GOAL * rate(t.size, t.cp_sync_s),
        "memory": peak <= RSS_GOAL_BYTES,
    }
    return out


def json_line(t: Timings) -> str:
    """The one JSON line the benchmark ends with."""
    return json.dumps(figures(t), sort_keys=True)


def read_json_line(output: str) -> dict[str, Any]:
    """The figures from a run's output: its last line that is a JSON object."""
    for line in reversed(output.strip().splitlines()):
        if line.startswith("{"):
            found = json.loads(line)
            if isinstance(found, dict):
                return found
    raise ValueError("the output holds no JSON line of figures: did the benchmark end early?")
