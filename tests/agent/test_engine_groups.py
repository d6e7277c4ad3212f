"""Killing an engine kills every process it started (vLLM's API server forks its engine core and workers)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from llmgw.agent.adoptedprocesses import AdoptedProcess
from llmgw.agent.launching import EngineSpawn, SubprocessLauncher
from llmgw.agent.shardstates import process_start_time
from llmgw.testing.eventually import eventually

# An engine that starts a child of its own, as vLLM's server starts its engine core, and waits.
FORKING = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


async def _spawn(tmp_path: Path) -> tuple[object, int]:
    marker = tmp_path / "child.pid"
    output = os.open(tmp_path / "out.log", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        spawn = EngineSpawn([sys.executable, "-c", FORKING, str(marker)], dict(os.environ), output)
        process = await SubprocessLauncher()(spawn)
    finally:
        os.close(output)
    await eventually(
        lambda: marker.exists() and marker.read_text(), timeout_s=20, message="the child started"
    )
    return process, int(marker.read_text())


async def test_a_killed_engine_takes_the_processes_it_started_with_it(tmp_path: Path) -> None:
    process, child = await _spawn(tmp_path)
    assert os.getpgid(process.pid) == process.pid  # type: ignore[attr-defined]  # its own group
    process.kill()  # type: ignore[attr-defined]
    assert await process.wait() == -9  # type: ignore[attr-defined]
    await eventually(lambda: not _alive(child), timeout_s=10, message="the engine's child is gone too")


async def test_an_adopted_engine_killed_takes_its_children_too(tmp_path: Path) -> None:
    process, child = await _spawn(tmp_path)
    pid = process.pid  # type: ignore[attr-defined]
    adopted = AdoptedProcess(pid, process_start_time(pid) or "")
    adopted.kill()
    await process.wait()  # type: ignore[attr-defined]  # reaped by its parent, this test
    await eventually(
        lambda: not _alive(child), timeout_s=10, message="the adopted engine's child is gone too"
    )
