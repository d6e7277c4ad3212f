"""The workers phase of the gateway benchmark: one process against N gateway workers, in the same run.

The control plane is started again with ``gateway.workers: 1`` and then
``N`` (its agent and engine keep running), and each time measured at
concurrency 64 for the same time: requests/s, and the CPU the control plane
and its workers spent per request (user + system time from ``/proc``, over
the phase, divided by the requests answered).
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmgw.controlplane.config import save_server_config
from llmgw.testing.cluster import Cluster, wait_for

TICKS = os.sysconf("SC_CLK_TCK")


def gateway_pids(cluster: Cluster) -> list[int]:
    """The control plane's pid and its gateway workers'."""
    parent = cluster.processes["server"].pid
    pids = [parent]
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if int(fields[1]) == parent and b"worker" in argv:
            pids.append(int(entry))
    return pids


def cpu_s(pids: list[int]) -> float:
    """User + system seconds the processes spent so far."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def restart_with_workers(cluster: Cluster, workers: int, model: str, body: Path) -> None:
    """The control plane started again with ``gateway.workers: workers``, serving /v1 once more."""
    cluster.kill("server", signal.SIGTERM)
    cluster.config.gateway.workers = workers
    save_server_config(cluster.config, cluster.home / "server.yaml")
    cluster.start_server()
    cluster.wait_ready(model, 60)
    request = urllib.request.Request(
        f"{cluster.url}/v1/chat/completions",
        data=body.read_bytes(),
        headers={"authorization": f"Bearer {cluster.key}", "content-type": "application/json"},
    )

    def answers() -> bool:
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return bool(answer.status == 200)
        except urllib.error.HTTPError:
            return False

    wait_for(answers, 60, "/v1 answers after the restart")
    if workers > 1:
        wait_for(lambda: len(gateway_pids(cluster)) == workers + 1, 30, f"{workers} gateway workers run")


def measure_workers(
    cluster: Cluster, workers: int, model: str, body: Path, scale: float, load: Callable[..., dict[str, Any]]
) -> dict[str, Any]:
    """Requests/s at concurrency 64 and CPU per request with one process, then with ``workers``."""
    figures: dict[str, Any] = {}
    for count in (1, workers):
        restart_with_workers(cluster, count, model, body)
        pids = gateway_pids(cluster)
        load(cluster.http_port, cluster.key, body, concurrency=64, count=2000, duration=3)  # warm-up
        print(f"[workers={count}] concurrency 64 ({len(pids)} processes)", flush=True)
        before, started = cpu_s(pids), time.monotonic()
        c64 = load(cluster.http_port, cluster.key, body, concurrency=64, count=10**6, duration=10 * scale)
        spent, wall = cpu_s(pids) - before, time.monotonic() - started
        figures[f"workers_{count}"] = {
            "processes": len(pids),
            "c64_rps": round(c64["rps"], 1),
            "c64_p50_us": round(c64["latency_us"]["p50"], 1),
            "cpu_us_per_request": round(1e6 * spent / max(1, c64["count"]), 1),
            "cores_busy": round(spent / wall, 2),
            "errors": c64["errors"],
        }
    one, many = figures["workers_1"], figures[f"workers_{workers}"]
    figures["ratio_workers_c64_rps"] = round(many["c64_rps"] / one["c64_rps"], 3)
    print(json.dumps(figures), flush=True)
    return figures
