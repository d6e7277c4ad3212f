"""The gateway bench's peers: sglang-router's command line, and the CPU a target and its children spend."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "bench" / "gateway" / "peers.py"
_SPEC = importlib.util.spec_from_file_location("bench_gateway_peers", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
peers = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = peers
_SPEC.loader.exec_module(peers)


def _stat(proc: Path, pid: int, parent: int, utime: int, stime: int, name: str = "x") -> None:
    (proc / str(pid)).mkdir()
    # fields after the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    fields = f"S {parent} 1 1 0 -1 0 0 0 0 0 {utime} {stime} 0 0"
    (proc / str(pid) / "stat").write_text(f"{pid} ({name}) {fields}\n")


def test_the_cpu_of_a_target_counts_every_process_below_it_and_nothing_beside(tmp_path: Path) -> None:
    _stat(tmp_path, 10, 1, 100, 50)  # the target
    _stat(tmp_path, 11, 10, 30, 20, name="worker (one)")  # its child, a name holding ") "
    _stat(tmp_path, 12, 11, 5, 5)  # a grandchild
    _stat(tmp_path, 20, 1, 999, 999)  # another process
    (tmp_path / "self").mkdir()
    assert sorted(peers.children(10, tmp_path)) == [10, 11, 12]
    assert peers.cpu_seconds(10, tmp_path) == (150 + 50 + 10) / peers.TICKS_PER_S


def test_a_busy_child_shows_in_its_parents_cpu() -> None:
    before = peers.cpu_seconds(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # spins until killed
    try:
        deadline = time.monotonic() + 20
        while peers.cpu_seconds(os.getpid()) - before < 0.2:
            assert time.monotonic() < deadline, "the spinning child's CPU never showed in its parent's"
            time.sleep(0.05)
    finally:
        child.kill()
        child.wait(10)


def test_the_rust_router_gets_the_engine_as_its_only_worker_and_its_key(tmp_path: Path) -> None:
    command = peers.rust_router_command(tmp_path, 4000, 5000, "sk-engine")
    assert command[:2] == [str(tmp_path / "bin" / "sglang-router"), "launch"]
    assert command[command.index("--worker-urls") + 1] == "http://127.0.0.1:5000"
    assert command[command.index("--port") + 1] == "4000"
    assert command[command.index("--api-key") + 1] == "sk-engine"
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert command[command.index("--prometheus-host") + 1] == "127.0.0.1"
