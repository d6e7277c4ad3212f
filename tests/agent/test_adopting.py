"""ShardSupervisor.adopt: what an agent does with the shards an earlier agent left on disk."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from pathlib import Path

from llmgw.agent.config import ShardSettings
from llmgw.agent.installing import Prepared
from llmgw.agent.shardstates import ShardRecord, process_command, process_start_time, write_state
from llmgw.agent.supervising import ShardSupervisor
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus
from llmgw.engines.vllm import kv_events_config
from llmgw.errors import LlmgwError


class Preparing:
    """A prepare step that records what it was asked and refuses (no engine needed)."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.called = asyncio.Event()

    async def __call__(self, spec: ShardSpec) -> Prepared:
        self.asked.append(spec.replica_id)
        self.called.set()
        raise LlmgwError("no build here", "a test")


def _supervisor(tmp_path: Path, prepare: Preparing) -> tuple[ShardSupervisor, list[ShardStatus]]:
    supervisor = ShardSupervisor(tmp_path, ShardSettings(), prepare)
    reported: list[ShardStatus] = []
    supervisor.report = reported.append
    return supervisor, reported


async def test_a_corrupt_state_file_leaves_its_shard_stopped_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "shards" / "r-bad").mkdir(parents=True)
    (tmp_path / "shards" / "r-bad" / "state.json").write_text("{half a file")
    prepare = Preparing()
    supervisor, _ = _supervisor(tmp_path, prepare)
    supervisor.adopt()
    [shard] = supervisor.snapshot()
    assert (shard.replica_id, shard.state) == ("r-bad", ShardState.STOPPED)
    assert "state.json" in shard.error
    assert prepare.asked == []
    supervisor.start(ShardSpec(replica_id="r-bad", model="m", engine="llama.cpp"))
    await asyncio.wait_for(prepare.called.wait(), 5)
    assert prepare.asked == ["r-bad"]


def _ended_process() -> tuple[int, list[str], str]:
    """The pid, command line and start time of a process that has ended."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stdout.readline() == b"up\n"
    command = process_command(child.pid) or []
    started = process_start_time(child.pid) or "1"
    child.communicate(b"")
    return child.pid, command, started


async def test_a_shard_whose_engine_is_gone_is_started_again_from_its_spec(tmp_path: Path) -> None:
    pid, command, started = _ended_process()
    spec = ShardSpec(replica_id="r-gone", model="m", engine="llama.cpp")
    write_state(
        tmp_path / "shards" / "r-gone",
        ShardRecord(spec=spec, command=command, pid=pid, start_time=started, port=21000),
    )
    prepare = Preparing()
    supervisor, reported = _supervisor(tmp_path, prepare)
    supervisor.adopt()
    await asyncio.wait_for(prepare.called.wait(), 5)
    assert prepare.asked == ["r-gone"]
    await asyncio.wait_for(supervisor.shards["r-gone"].task, 5)  # type: ignore[arg-type]
    assert reported[-1].state == ShardState.FAILED


async def test_a_directory_without_a_state_file_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "shards" / "r-empty").mkdir(parents=True)
    supervisor, _ = _supervisor(tmp_path, Preparing())
    supervisor.adopt()
    assert supervisor.snapshot() == []


def _live_process(*args: str) -> subprocess.Popen[bytes]:
    """A process with ``args`` on its command line, up until its stdin closes."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stdout.readline() == b"up\n"
    return child


async def test_an_adopted_vllm_engine_keeps_its_kv_events_and_replay_ports(tmp_path: Path) -> None:
    child = _live_process("--kv-events-config", json.dumps(kv_events_config(21500, 21501)))
    try:
        spec = ShardSpec(replica_id="r-kv", model="m", engine="vllm", kv_events=True)
        record = ShardRecord(
            spec=spec, command=process_command(child.pid) or [], pid=child.pid,
            start_time=process_start_time(child.pid) or "", port=21499,
        )  # fmt: skip
        write_state(tmp_path / "shards" / "r-kv", record)
        supervisor, _ = _supervisor(tmp_path, Preparing())
        supervisor.adopt()
        shard = supervisor.shards["r-kv"]
        assert (shard.kv_events_port, shard.kv_replay_port) == (21500, 21501)
        assert shard.ports == {21499, 21500, 21501}  # none of them handed to another shard
        for task in (shard.task, shard.follower):
            assert task is not None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    finally:
        child.communicate(b"")
