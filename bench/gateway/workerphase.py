"""The workers phase of the gateway benchmark: one process against N gateway workers, in the same run.

The control plane is started again with ``gateway.workers: 1`` and then
``N`` (its agent and engine keep running), alternated ``rounds`` times, and
each time measured at concurrency 64 for the same time: requests/s, and the
CPU the control plane and its workers spent per request (user + system time
from ``/proc``, over the phase, divided by the requests answered), with the
engine's and the load generator's beside it.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
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


def engine_pids(port: int) -> list[int]:
    """The engine's process: the static nginx (its run directory in its command line) or the stand-in."""
    marks = (b"llmgw-nginx-", b"--port\0%d\0" % port)
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes() + b"\0"
            except OSError:
                continue
            if any(mark in argv for mark in marks):
                found.append(int(entry))
    return found


def phase(cluster: Cluster, count: int, model: str, engine_port: int, body: Path, scale: float,
          load: Callable[..., dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """One measurement at concurrency 64 with ``count`` gateway processes, the CPU of every side."""
    restart_with_workers(cluster, count, model, body)
    pids, engine = gateway_pids(cluster), engine_pids(engine_port)
    load(cluster.http_port, cluster.key, body, concurrency=64, count=2000, duration=3)  # warm-up
    print(f"[workers={count}] concurrency 64 ({len(pids)} processes)", flush=True)
    before, engine_before, started = cpu_s(pids), cpu_s(engine), time.monotonic()
    c64 = load(cluster.http_port, cluster.key, body, concurrency=64, count=10**6, duration=10 * scale)
    spent, wall = cpu_s(pids) - before, time.monotonic() - started
    engine_spent, answered = cpu_s(engine) - engine_before, max(1, c64["count"])
    figures = {
        "processes": len(pids),
        "c64_rps": round(c64["rps"], 1),
        "c64_p50_us": round(c64["latency_us"]["p50"], 1),
        "cpu_us_per_request": round(1e6 * spent / answered, 1),
        "cores_busy": round(spent / wall, 2),
        "engine_cpu_us_per_request": round(1e6 * engine_spent / answered, 1),
        "errors": c64["errors"],
    }
    if "load_cpu_s" in c64:
        figures["load_cpu_us_per_request"] = round(1e6 * c64["load_cpu_s"] / answered, 1)
    print(f"  {json.dumps(figures)}", flush=True)
    return figures


def measure_workers(
    cluster: Cluster,
    workers: int,
    model: str,
    body: Path,
    scale: float,
    load: Callable[..., dict[str, Any]],
    *,
    engine_port: int = 0,
    rounds: int = 1,
) -> dict[str, Any]:
    """Requests/s at concurrency 64 and CPU per request with one process, then with ``workers``,
    alternated ``rounds`` times (ABAB...): each round's ratio, their median and spread."""
    runs: dict[int, list[dict[str, Any]]] = {1: [], workers: []}
    ratios = []
    for _ in range(rounds):
        for count in (1, workers):
            runs[count].append(phase(cluster, count, model, engine_port, body, scale, load))
        ratios.append(round(runs[workers][-1]["c64_rps"] / runs[1][-1]["c64_rps"], 3))
    figures: dict[str, Any] = {}
    for count, measured in runs.items():
        figures[f"workers_{count}"] = {
            field: round(statistics.median(m[field] for m in measured), 2) for field in measured[0]
        }
        if rounds > 1:
            figures[f"workers_{count}"]["c64_rps_each"] = [m["c64_rps"] for m in measured]
    figures["ratio_workers_c64_rps"] = round(statistics.median(ratios), 3)
    if rounds > 1:
        figures["ratio_each"] = ratios
        figures["ratio_min"], figures["ratio_max"] = min(ratios), max(ratios)
    print(json.dumps(figures), flush=True)
    return figures
