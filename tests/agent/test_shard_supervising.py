"""The shard supervisor through its seams: engines from a fake launcher, time on a fake clock.

Most engines here never become healthy (nothing listens on its port), so a
shard's life is decided by how its fake process ends and how the clock moves;
an :class:`AnsweringEngine` answers its health check until it is frozen.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from llmgw.agent.config import ShardSettings
from llmgw.agent.installing import Prepared
from llmgw.agent.launching import EngineSpawn
from llmgw.agent.metrics import REGISTRY as AGENT_METRICS
from llmgw.agent.supervising import ShardSupervisor
from llmgw.core.engines import LLAMA_CPP, SGLANG, VLLM, EngineCapabilities
from llmgw.core.shards import AdapterSpec, ShardSpec, ShardState, ShardStatus
from llmgw.engines.engine import LaunchAdapter
from llmgw.testing.clock import FakeClock
from llmgw.testing.eventually import eventually

GRACE_S = 10.0
SETTINGS = ShardSettings(
    stop_grace_s=GRACE_S,
    max_quick_restarts=5,
    restart_backoff_s=1.0,
    restart_backoff_max_s=30.0,
    health_timeout_s=600.0,
    liveness_s=30.0,
)


class FakeEngine:
    """An engine process as the supervisor sees it: a pid, an end, and the signals it was sent."""

    def __init__(self, pid: int, clock: FakeClock, ends_on: tuple[int, ...]) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.signals: list[tuple[signal.Signals, float]] = []
        self._clock = clock
        self._ends_on = ends_on
        self._ended = asyncio.Event()

    def end(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    async def wait(self) -> int:
        await self._ended.wait()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is not None:
            raise ProcessLookupError(self.pid)
        self.signals.append((signal.Signals(signum), self._clock.monotonic()))
        if signum in self._ends_on or signum == signal.SIGKILL:
            self.end(-signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


@dataclass
class FakeLauncher:
    """Starts :class:`FakeEngine` s: ones that crash at once, or ones that run until signalled."""

    clock: FakeClock
    crash: bool = False
    ends_on: tuple[int, ...] = (signal.SIGTERM,)
    """The signals a running engine ends on (SIGKILL always ends it)."""
    engines: list[FakeEngine] = field(default_factory=list)
    spawned_at: list[float] = field(default_factory=list)
    spawns: list[EngineSpawn] = field(default_factory=list)
    says: bytes = b""
    """What each engine writes to its output as it starts."""

    async def __call__(self, spawn: EngineSpawn) -> FakeEngine:
        os.write(spawn.output, self.says)
        engine = FakeEngine(40_000 + len(self.engines), self.clock, self.ends_on)
        if self.crash:
            engine.end(1)
        self.engines.append(engine)
        self.spawned_at.append(self.clock.monotonic())
        self.spawns.append(spawn)
        return engine


@dataclass
class Running:
    supervisor: ShardSupervisor
    launcher: FakeLauncher
    clock: FakeClock
    statuses: list[ShardStatus]

    def states(self) -> list[ShardState]:
        return [status.state for status in self.statuses]

    def crashes(self) -> int:
        return sum(1 for status in self.statuses if status.error.startswith("engine exited with code 1"))


async def _prepare(spec: ShardSpec) -> Prepared:
    return Prepared(program=Path("/opt/llama.cpp/llama-server"), weights=Path("/models/m.gguf"))


@pytest.fixture
def launcher() -> FakeLauncher:
    return FakeLauncher(FakeClock())


@pytest.fixture
async def running(tmp_path: Path, launcher: FakeLauncher) -> AsyncIterator[Running]:
    supervisor = ShardSupervisor(tmp_path, SETTINGS, _prepare, launcher=launcher, clock=launcher.clock)
    statuses: list[ShardStatus] = []
    supervisor.report = statuses.append
    yield Running(supervisor, launcher, launcher.clock, statuses)
    for engine in launcher.engines:
        if engine.returncode is None:
            engine.end(0)
    await supervisor.stop_all()


def start(running: Running) -> None:
    spec = ShardSpec(replica_id="r1", model="m", engine=LLAMA_CPP.name, api_key="sk-replica")
    running.supervisor.start(spec)


async def test_the_engine_is_spawned_with_its_command_line_and_output(running: Running) -> None:
    start(running)
    await eventually(lambda: running.launcher.spawns, message="the engine is spawned")

    (spawn,) = running.launcher.spawns
    assert spawn.command[0] == "/opt/llama.cpp/llama-server"
    assert "/models/m.gguf" in spawn.command
    assert spawn.cwd == running.supervisor.shards["r1"].directory
    assert running.supervisor.shards["r1"].process is running.launcher.engines[0]


@pytest.mark.parametrize("engine", [LLAMA_CPP, SGLANG, VLLM])
async def test_the_key_reaches_the_engine_by_file_or_variable_never_by_its_command_line(
    running: Running, engine: EngineCapabilities
) -> None:
    spec = ShardSpec(replica_id="r1", model="m", engine=engine.name, api_key="sk-replica")
    running.supervisor.start(spec)
    await eventually(lambda: running.launcher.spawns, message="the engine is spawned")

    (spawn,) = running.launcher.spawns
    assert not any("sk-replica" in arg for arg in spawn.command)
    source = engine.key_input
    if source.in_file:
        path = Path(spawn.command[spawn.command.index(source.name) + 1])
        assert path.parent == running.supervisor.shards["r1"].directory
        text, mode = await asyncio.to_thread(lambda: (path.read_text(), path.stat().st_mode))
        assert text == source.file_text("sk-replica")
        assert stat.S_IMODE(mode) == 0o600
        assert source.name not in spawn.env
    else:
        assert spawn.env[source.name] == "sk-replica"


async def test_a_key_the_engine_printed_before_it_crashed_is_blanked_in_the_reason(running: Running) -> None:
    running.launcher.crash = True
    running.launcher.says = b"server_args=ServerArgs(api_key='sk-replica')\n"
    start(running)

    await eventually(lambda: running.crashes() == 1, message="the crash is reported")

    reason = running.statuses[-1].error
    assert "sk-replica" not in reason and "api_key='**********'" in reason


async def test_five_quick_failures_in_a_row_fail_the_shard(running: Running) -> None:
    running.launcher.crash = True
    start(running)

    for crashes, delay in enumerate((1.0, 2.0, 4.0, 8.0), start=1):
        await eventually(lambda n=crashes: running.crashes() == n, message=f"crash {crashes} is reported")
        await running.clock.advance(delay)
    await eventually(lambda: running.states()[-1] == ShardState.FAILED, message="the shard fails")

    assert len(running.launcher.engines) == 5
    assert running.statuses[-1].error.startswith("engine exited with code 1")
    assert running.supervisor.shards["r1"].restarts == 5
    await running.clock.advance(3600)
    assert len(running.launcher.engines) == 5, "a failed shard is not started again by the agent"


async def test_restarts_back_off_doubling_from_the_base_delay(running: Running) -> None:
    running.launcher.crash = True
    start(running)
    started = running.clock.monotonic()

    for crashes, delay in enumerate((1.0, 2.0, 4.0), start=1):
        await eventually(lambda n=crashes: running.crashes() == n, message=f"crash {crashes} is reported")
        await running.clock.advance(delay - 0.01)
        assert len(running.launcher.engines) == crashes, f"restarted before {delay} s"
        await running.clock.advance(0.01)
        await eventually(lambda n=crashes: len(running.launcher.engines) == n + 1, message="the restart")

    assert [at - started for at in running.launcher.spawned_at] == pytest.approx([0.0, 1.0, 3.0, 7.0])


async def test_stopping_sends_sigterm_waits_the_grace_then_sigkill(running: Running) -> None:
    running.launcher.ends_on = ()  # an engine that ignores SIGTERM
    start(running)
    await eventually(lambda: running.launcher.engines, message="the engine is spawned")
    (engine,) = running.launcher.engines
    asked = running.clock.monotonic()

    stopping = asyncio.create_task(running.supervisor.stop("r1", "idle"))
    await eventually(lambda: engine.signals, message="the engine is sent a signal")
    await running.clock.advance(GRACE_S - 0.1)
    assert [sig for sig, _ in engine.signals] == [signal.SIGTERM], "killed before the grace ended"
    await running.clock.advance(0.1)
    await asyncio.wait_for(stopping, 5)

    assert engine.signals == [(signal.SIGTERM, asked), (signal.SIGKILL, asked + GRACE_S)]
    assert running.states()[-1] == ShardState.STOPPED
    assert "r1" not in running.supervisor.shards


async def test_an_engine_that_ends_on_sigterm_is_not_killed(running: Running) -> None:
    start(running)
    await eventually(lambda: running.launcher.engines, message="the engine is spawned")
    (engine,) = running.launcher.engines

    await asyncio.wait_for(running.supervisor.stop("r1", "idle"), 5)

    assert [sig for sig, _ in engine.signals] == [signal.SIGTERM]
    assert engine.returncode == -signal.SIGTERM
    assert running.states()[-1] == ShardState.STOPPED
    assert len(running.launcher.engines) == 1, "a stopped shard is not restarted"


class AnsweringEngine(FakeEngine):
    """A FakeEngine that answers its health check on its port, and hangs once frozen (as SIGSTOP does)."""

    def __init__(self, pid: int, clock: FakeClock, ends_on: tuple[int, ...], port: int) -> None:
        super().__init__(pid, clock, ends_on)
        self.port = port
        self.checks = 0
        self.frozen = False
        self.thawed = asyncio.Event()
        self.runner = web.AppRunner(web.Application(), shutdown_timeout=0.1)
        self.runner.app.router.add_get("/health", self._health)

    async def serve(self) -> None:
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def _health(self, request: web.Request) -> web.Response:
        self.checks += 1
        if self.frozen:
            await self.thawed.wait()
        return web.Response(status=200 if self.returncode is None else 503)

    def end(self, code: int) -> None:
        super().end(code)
        self.thawed.set()


@dataclass
class AnsweringLauncher(FakeLauncher):
    async def __call__(self, spawn: EngineSpawn) -> FakeEngine:
        port = int(spawn.command[spawn.command.index("--port") + 1])
        engine = AnsweringEngine(40_000 + len(self.engines), self.clock, self.ends_on, port)
        await engine.serve()
        self.engines.append(engine)
        self.spawned_at.append(self.clock.monotonic())
        self.spawns.append(spawn)
        return engine


@pytest.fixture
async def answering(tmp_path: Path) -> AsyncIterator[Running]:
    """A supervisor whose engines answer; the first one freezes the moment it is reported ready."""
    launcher = AnsweringLauncher(FakeClock())
    supervisor = ShardSupervisor(tmp_path, SETTINGS, _prepare, launcher=launcher, clock=launcher.clock)
    statuses: list[ShardStatus] = []

    def report(status: ShardStatus) -> None:
        statuses.append(status)
        if status.state == ShardState.READY and len(launcher.engines) == 1:
            launcher.engines[0].frozen = True  # type: ignore[attr-defined]

    supervisor.report = report
    yield Running(supervisor, launcher, launcher.clock, statuses)
    for engine in launcher.engines:
        if engine.returncode is None:
            engine.end(0)
    await supervisor.stop_all()
    for engine in launcher.engines:
        await engine.runner.cleanup()  # type: ignore[attr-defined]


async def _frozen_when_ready(running: Running) -> tuple[AnsweringEngine, float]:
    """The first engine, ready, frozen, with its first liveness check hanging; when it was ready."""
    start(running)
    await eventually(lambda: ShardState.READY in running.states(), message="the shard is ready")
    ready_at = running.clock.monotonic()
    engine = running.launcher.engines[0]
    assert isinstance(engine, AnsweringEngine)
    await eventually(lambda: engine.checks == 2, message="a liveness check reaches the frozen engine")
    return engine, ready_at


async def test_a_ready_engine_that_stops_answering_is_reported_not_ready_killed_and_restarted(
    answering: Running,
) -> None:
    engine, ready_at = await _frozen_when_ready(answering)

    await answering.clock.advance(SETTINGS.liveness_s - 0.1)
    assert engine.signals == [] and answering.states()[-1] == ShardState.READY
    await answering.clock.advance(0.1)
    await eventually(lambda: engine.signals, message="the frozen engine is signalled")

    assert engine.signals == [(signal.SIGKILL, ready_at + SETTINGS.liveness_s)], "SIGKILL, not SIGTERM"
    after = answering.statuses[answering.states().index(ShardState.READY) + 1]
    assert after.state == ShardState.STARTING
    assert "stopped answering its health check for 30 s" in after.error
    await answering.clock.advance(SETTINGS.restart_backoff_s)
    await eventually(lambda: answering.states().count(ShardState.READY) == 2, message="ready again")
    assert len(answering.launcher.engines) == 2 and answering.launcher.engines[1].signals == []
    assert answering.supervisor.shards["r1"].restarts == 1


async def test_an_engine_that_answers_again_within_its_liveness_is_left_running(answering: Running) -> None:
    engine, _ = await _frozen_when_ready(answering)

    await answering.clock.advance(SETTINGS.liveness_s - 1)
    engine.thawed.set()

    async def checked_again() -> bool:
        await answering.clock.advance(0.1)
        return engine.checks >= 3

    await eventually(checked_again, message="the engine is checked again after it answered")
    await answering.clock.advance(SETTINGS.liveness_s - 3)

    assert engine.signals == [] and engine.returncode is None
    assert answering.states()[-1] == ShardState.READY


async def test_an_engine_still_starting_is_allowed_its_start_up_time(running: Running) -> None:
    start(running)
    await eventually(lambda: running.launcher.engines, message="the engine is spawned")

    await running.clock.advance(SETTINGS.liveness_s * 4)

    assert running.launcher.engines[0].signals == [], "liveness applies only once the shard was ready"
    assert len(running.launcher.engines) == 1


async def test_engine_starts_and_restarts_are_counted_by_engine(running: Running) -> None:
    labels = {"engine": LLAMA_CPP.name}
    starts = AGENT_METRICS.get_sample_value("llmgw_agent_engine_starts_total", labels) or 0.0
    restarts = AGENT_METRICS.get_sample_value("llmgw_agent_engine_restarts_total", labels) or 0.0
    running.launcher.crash = True
    start(running)

    await eventually(lambda: running.crashes() == 1, message="the first engine crashed")
    await running.clock.advance(1.0)
    await eventually(lambda: len(running.launcher.engines) == 2, message="the restart")

    assert AGENT_METRICS.get_sample_value("llmgw_agent_engine_starts_total", labels) == starts + 2
    assert AGENT_METRICS.get_sample_value("llmgw_agent_engine_restarts_total", labels) == restarts + 1


async def test_an_engine_given_cards_sees_them_numbered_in_pci_bus_order_as_placement_chose_them(
    running: Running,
) -> None:
    spec = ShardSpec(replica_id="r1", model="m", engine=VLLM.name, api_key="sk-replica", devices=(1, 2))
    running.supervisor.start(spec)
    await eventually(lambda: running.launcher.spawns, message="the engine is spawned")

    (spawn,) = running.launcher.spawns
    assert (spawn.env["CUDA_DEVICE_ORDER"], spawn.env["CUDA_VISIBLE_DEVICES"]) == ("PCI_BUS_ID", "1,2")


async def test_a_running_shard_loading_adapters_at_run_time_fetches_those_its_start_adds(
    tmp_path: Path,
) -> None:
    """Sent its start again with a new adapter (published while it runs), a shard whose engine loads
    adapters at run time fetches it and reports its path, without a restart."""
    launcher = FakeLauncher(FakeClock())
    fetched: list[tuple[str, ...]] = []

    async def prepare(spec: ShardSpec) -> Prepared:
        fetched.append(tuple(a.name for a in spec.adapters))
        adapters = tuple(LaunchAdapter(a.name, Path(f"/w/{a.name}")) for a in spec.adapters)
        return Prepared(program=Path("/v/bin/vllm"), weights=Path("/models/m"), adapters=adapters)

    supervisor = ShardSupervisor(tmp_path, SETTINGS, prepare, launcher=launcher, clock=launcher.clock)
    statuses: list[ShardStatus] = []
    supervisor.report = statuses.append
    spec = ShardSpec(
        replica_id="r1", model="m", engine=VLLM.name, api_key="sk-replica", max_loaded_adapters=2
    )
    try:
        supervisor.start(spec)
        await eventually(lambda: launcher.spawns, message="the engine is spawned")
        tone = AdapterSpec(name="tone", sha256="b" * 64, filename="adapter_model.safetensors")
        supervisor.start(dataclasses.replace(spec, adapters=(tone,)))
        await eventually(
            lambda: statuses and dict(statuses[-1].adapter_paths) == {"tone": "/w/tone"},
            message="the new adapter's path is reported",
        )
        assert fetched == [(), ("tone",)] and len(launcher.spawns) == 1  # fetched, not restarted
        assert supervisor.shards["r1"].spec.adapters == (tone,)
    finally:
        for engine in launcher.engines:
            if engine.returncode is None:
                engine.end(0)
        await supervisor.stop_all()
