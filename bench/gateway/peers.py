"""The gateway bench's peers beside LiteLLM: sglang-router (PyPI's Rust router), and the CPU each spends.

sglang-router runs in its own virtualenv (``make bench-gateway`` installs it,
``SGLANG_ROUTER_VERSION``) with the engine as its one worker, OpenAI backend,
no retries, no circuit breaker and no health checks past its start, so that
what it does per request is routing and relaying only. It passes the client's
``Authorization`` on to the worker, so its clients send the engine's key.

The CPU a target spends is read from ``/proc``: user and system time of the
process and every process below it (LiteLLM's worker, a gateway's workers),
so ``cores_busy`` over a phase says how many cores the target held.
"""

from __future__ import annotations

import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path

from llmgw.testing.cluster import free_port

TICKS_PER_S = 100
"""Clock ticks per second of /proc/PID/stat's times (``getconf CLK_TCK``: 100 on Linux)."""


def children(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """``pid`` and every process below it, read from each process's parent in ``proc``."""
    parents: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        one = todo.pop()
        tree.append(one)
        todo.extend(parents.get(one, ()))
    return tree


def cpu_seconds(pid: int, proc: Path = Path("/proc")) -> float:
    """User and system CPU seconds spent by ``pid`` and the processes below it (0 for one gone)."""
    total = 0
    for one in children(pid, proc):
        try:
            fields = (proc / str(one) / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / TICKS_PER_S


def rust_router_command(venv: Path, port: int, engine_port: int, engine_key: str) -> list[str]:
    """sglang-router's command line: the engine its one worker, nothing but routing and relaying."""
    return [
        str(venv / "bin" / "sglang-router"), "launch",
        "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", f"http://127.0.0.1:{engine_port}",
        "--backend", "openai", "--policy", "round_robin",
        "--api-key", engine_key,
        "--disable-retries", "--disable-circuit-breaker", "--disable-health-check",
        "--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1",
        "--log-level", "error",
    ]  # fmt: skip


def start_rust_router(
    venv: Path,
    home: Path,
    engine_port: int,
    engine_key: str,
    wait_for: Callable[..., object],
) -> tuple[subprocess.Popen[bytes], int]:
    """sglang-router started on a free port and answering its ``/v1/models``; (process, port)."""
    port = free_port()
    log = (home / "sglang-router.log").open("wb")
    process = subprocess.Popen(
        rust_router_command(venv, port, engine_port, engine_key),
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"sglang-router exited: {(home / 'sglang-router.log').read_text()[-2000:]}")
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {engine_key}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    try:
        wait_for(ready, 120, "sglang-router answers", interval_s=0.5)
    except BaseException:
        process.terminate()
        process.wait(20)
        raise
    return process, port
