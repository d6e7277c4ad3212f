"""A starting shard's fetch goes up as progress: bytes done of all, the rate, at most twice a second."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

from llmgw.agent.config import AgentConfig
from llmgw.agent.fetchprogress import FetchMeters, shard_files
from llmgw.agent.installing import BlobFetcher, Installer
from llmgw.agent.launching import EngineProcess, EngineSpawn
from llmgw.agent.supervising import ShardSupervisor
from llmgw.core.devices import NodeInventory
from llmgw.core.shards import AdapterSpec, FetchProgress, ShardSpec, ShardState, ShardStatus, WeightsFile
from llmgw.errors import LlmgwError
from llmgw.testing.clock import FakeClock
from llmgw.testing.eventually import eventually

MB = 1_000_000


async def test_a_shard_is_reported_once_an_interval_has_passed_with_its_rate_since_the_last_report() -> None:
    clock = FakeClock()
    reports: list[tuple[str, FetchProgress]] = []
    meters = FetchMeters(lambda replica, progress: reports.append((replica, progress)), clock, 0.5)
    meters.begin("r1", {"a": 600 * MB, "b": 400 * MB})
    meters.advanced("a", 100 * MB)
    assert reports == []  # too soon after the start
    await clock.advance(0.5)
    meters.advanced("a", 200 * MB)
    assert reports == [("r1", FetchProgress(done=200 * MB, total=1000 * MB, bytes_per_s=400 * MB))]
    await clock.advance(0.25)
    meters.advanced("b", 100 * MB)  # within the interval: no report
    await clock.advance(0.25)
    meters.advanced("b", 150 * MB)
    assert len(reports) == 2
    assert reports[1][1] == FetchProgress(done=350 * MB, total=1000 * MB, bytes_per_s=300 * MB)
    assert reports[1][1].describe() == "fetching 35 % at 300 MB/s"


async def test_bytes_found_on_the_node_count_as_done_but_not_towards_the_rate() -> None:
    clock = FakeClock()
    reports: list[FetchProgress] = []
    meters = FetchMeters(lambda replica, progress: reports.append(progress), clock, 0.5)
    meters.begin("r1", {"a": 1000, "b": 1000})
    meters.found("a", 1000)  # checked and reused
    meters.found("b", 300)  # a partial resumed
    await clock.advance(1.0)
    meters.advanced("b", 500)
    assert reports == [FetchProgress(done=1500, total=2000, bytes_per_s=200.0)]


async def test_two_shards_sharing_a_file_both_count_it_and_an_ended_shard_is_no_longer_reported() -> None:
    clock = FakeClock()
    reports: list[tuple[str, int]] = []
    meters = FetchMeters(lambda replica, progress: reports.append((replica, progress.done)), clock, 0.5)
    meters.begin("r1", {"base": 100, "config-1": 10})
    meters.begin("r2", {"base": 100, "config-2": 10})
    await clock.advance(0.5)
    meters.advanced("base", 50)
    assert sorted(reports) == [("r1", 50), ("r2", 50)]
    meters.end("r1")
    await clock.advance(0.5)
    meters.advanced("base", 100)
    assert reports[-1] == ("r2", 100) and len(reports) == 3
    assert list(meters.metering()) == ["r2"]


def test_a_shards_files_are_its_weights_extra_files_projector_and_adapters_each_once() -> None:
    spec = ShardSpec(
        replica_id="r1",
        model="m",
        weights_sha256="w",
        weights_size=100,
        files=(WeightsFile("c", "config.json", 2), WeightsFile("w", "copy.safetensors", 100)),
        projector_sha256="p",
        projector_size=7,
        adapters=(AdapterSpec("lora", "l", "adapter.gguf", 5),),
    )
    assert shard_files(spec) == {"w": 100, "c": 2, "p": 7, "l": 5}


class SlowMirror:
    """One blob in chunks of 10 MB, the clock moving 0.125 s per chunk (80 MB/s)."""

    def __init__(self, data: bytes, clock: FakeClock) -> None:
        self.data = data
        self.clock = clock

    def fetcher(self) -> BlobFetcher:
        async def fetch(digest: str, offset: int) -> AsyncIterator[bytes]:
            for start in range(offset, len(self.data), 10 * MB):
                await self.clock.advance(0.125)
                yield self.data[start : start + 10 * MB]

        return fetch


async def _no_engine(spawn: EngineSpawn) -> EngineProcess:
    raise LlmgwError("no engine in this test", "none")


async def test_a_starting_shard_reports_its_fetch_throttled_then_no_longer_once_its_files_are_there(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    data = bytes(100 * MB)
    program = tmp_path / "llama-server"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    config = AgentConfig.model_validate(
        {
            "node_id": "n1",
            "control_planes": ["127.0.0.1:1"],
            "work_dir": str(tmp_path / "work"),
            "engines": {"llamacpp": {"binary": str(program)}},
        }
    )
    mirror = SlowMirror(data, clock)
    supervisor: ShardSupervisor
    meters = FetchMeters(lambda replica, progress: supervisor.fetching(replica, progress), clock)
    installer = Installer(config, lambda: NodeInventory(node_id="n1"), mirror.fetcher, meters=meters)
    supervisor = ShardSupervisor(
        tmp_path / "work", config.shards, installer.prepare, launcher=_no_engine, clock=clock
    )
    statuses: list[tuple[float, ShardStatus]] = []
    supervisor.report = lambda status: statuses.append((clock.monotonic(), status))
    spec = ShardSpec(
        replica_id="r1",
        model="m",
        weights_sha256=hashlib.sha256(data).hexdigest(),
        weights_filename="m.gguf",
        weights_size=len(data),
        api_key="sk-replica",
    )
    started = clock.monotonic()
    supervisor.start(spec)
    await eventually(lambda: statuses and statuses[-1][1].state is ShardState.FAILED)

    fetching = [(at, s.fetching) for at, s in statuses if s.fetching is not None]
    assert [s.state for _, s in statuses if s.fetching is not None] == [ShardState.STARTING] * len(fetching)
    times = [started, *(at for at, _ in fetching)]
    done = [0, *(p.done for _, p in fetching)]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert len(fetching) >= 2 and min(gaps) >= 0.5  # at most two reports a second
    assert len(fetching) <= (clock.monotonic() - started) / 0.5
    assert done == sorted(done) and done[-1] <= 100 * MB
    assert {p.total for _, p in fetching} == {100 * MB}
    assert [p.bytes_per_s for _, p in fetching] == [
        (now - before) / gap for before, now, gap in zip(done[:-1], done[1:], gaps, strict=True)
    ]
    last = max(i for i, (_, s) in enumerate(statuses) if s.fetching is not None)
    assert statuses[last + 1][1].state is ShardState.STARTING and statuses[last + 1][1].fetching is None
    await supervisor.stop_all()
