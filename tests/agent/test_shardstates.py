"""Shard state files: written atomically, read back whole or refused, a process told by its start time."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.agent.adoptedprocesses import AdoptedProcess
from llmgw.agent.shardstates import (
    CorruptState,
    ShardRecord,
    is_engine,
    process_command,
    process_start_time,
    read_state,
    write_state,
)
from llmgw.core.shards import Compute, ShardSpec
from llmgw.protocol.shards import shard_spec_bytes


def _record(**changes: object) -> ShardRecord:
    record = ShardRecord(
        spec=ShardSpec(replica_id="r-1", model="m", api_key="sk-replica", devices=(0, 1)),
        command=["/bin/engine", "--port", "21000"],
        pid=4242,
        start_time="123",
        port=21000,
        compute=Compute(backend="cuda", devices=(0, 1), layers_offloaded=31, memory_mb=9000),
        restarts=2,
        output="output-2.log",
    )
    for name, value in changes.items():
        setattr(record, name, value)
    return record


def test_a_state_file_reads_back_what_was_written_and_only_its_owner_reads_it(tmp_path: Path) -> None:
    write_state(tmp_path, _record())
    back = read_state(tmp_path)
    assert back.spec == _record().spec
    assert back.compute == _record().compute
    assert (back.command, back.pid, back.start_time, back.port, back.restarts, back.output) == (
        ["/bin/engine", "--port", "21000"],
        4242,
        "123",
        21000,
        2,
        "output-2.log",
    )
    assert (tmp_path / "state.json").stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_a_state_file_an_earlier_agent_wrote_is_read_back(tmp_path: Path) -> None:
    """Earlier agents left a compute's empty fields out and wrote its memory as a string."""
    spec = base64.b64encode(shard_spec_bytes(ShardSpec(replica_id="r-1", model="m"))).decode()
    earlier = {"format": 1, "spec": spec, "command": ["/bin/engine"], "pid": 7, "start_time": "9", "port": 1,
               "compute": {"backend": "cuda", "devices": [0], "memory_mb": "9000"}}  # fmt: skip
    (tmp_path / "state.json").write_text(json.dumps(earlier))
    back = read_state(tmp_path)
    assert back.spec == ShardSpec(replica_id="r-1", model="m")
    assert back.compute == Compute(backend="cuda", devices=(0,), memory_mb=9000)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[]",
        '{"format": 1}',
        '{"format": 1, "spec": "%%%", "command": [], "pid": 1, "start_time": "1", "port": 1}',
        '{"format": 2}',
    ],
)
def test_a_corrupt_state_file_is_refused_naming_the_file(tmp_path: Path, text: str) -> None:
    (tmp_path / "state.json").write_text(text)
    with pytest.raises(CorruptState) as caught:
        read_state(tmp_path)
    assert str(tmp_path / "state.json") in str(caught.value)


def _sleeper() -> subprocess.Popen[bytes]:
    """A process that runs until killed, returned once it says it runs (its argv is in /proc then)."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE
    )
    assert child.stdout is not None and child.stdout.readline() == b"up\n"
    return child


def test_a_live_process_is_the_engine_only_with_its_start_time_and_command_line(tmp_path: Path) -> None:
    child = _sleeper()
    try:
        started = process_start_time(child.pid)
        command = process_command(child.pid)
        assert started and command
        assert is_engine(_record(pid=child.pid, start_time=started, command=command))
        assert not is_engine(_record(pid=child.pid, start_time=str(int(started) + 1), command=command))
        assert not is_engine(_record(pid=child.pid, start_time=started, command=[*command, "--other"]))
    finally:
        child.kill()
        child.wait()
    assert not is_engine(_record(pid=child.pid, start_time=started, command=command))


async def test_an_adopted_process_is_waited_for_and_stopped_by_its_pid() -> None:
    child = _sleeper()
    started = process_start_time(child.pid)
    assert started
    adopted = AdoptedProcess(child.pid, started)
    assert adopted.returncode is None
    adopted.terminate()
    # Still this process's child (as an engine is after the agent re-executes itself): reaped,
    # with its exit code, rather than left a zombie until the agent ends.
    assert await asyncio.wait_for(adopted.wait(), 10) == -signal.SIGTERM
    assert not os.path.exists(f"/proc/{child.pid}")  # noqa: ASYNC240
    assert adopted.returncode == -signal.SIGTERM
    with pytest.raises(ProcessLookupError):
        adopted.kill()
    assert os.getpid() != child.pid


def test_a_script_run_through_its_interpreter_is_the_engine_it_started(tmp_path: Path) -> None:
    """A console script (vLLM's ``vllm``) shows in /proc behind the interpreter of its #! line."""
    script = tmp_path / "vllm"
    script.write_text(f"#!{sys.executable}\nimport time\nprint('up', flush=True)\ntime.sleep(60)\n")
    script.chmod(0o755)
    command = [str(script), "serve", "model", "--port", "8000"]
    child = subprocess.Popen(command, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        started = process_start_time(child.pid)
        assert started
        assert process_command(child.pid) == [sys.executable, *command]
        assert is_engine(_record(pid=child.pid, start_time=started, command=command))
        assert not is_engine(_record(pid=child.pid, start_time=started, command=[*command[:-1], "8001"]))
        assert not is_engine(_record(pid=child.pid, start_time=started, command=command[1:]))
    finally:
        child.kill()
        child.wait()
