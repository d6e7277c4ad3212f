"""Supervising shards: engine processes started, health-checked, restarted and stopped.

Each shard runs one task: prepare (engine build, weights) → launch → wait for
health → READY → wait for the process; a crash restarts it with backoff, and
too many crashes in a row without becoming ready report it FAILED (the
control plane then starts it again later). Stopping sends SIGTERM, waits the
grace period, then SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from llmgw.agent.config import ShardSettings
from llmgw.agent.installing import Prepared
from llmgw.core.backoff import Backoff
from llmgw.core.mig import visible_devices
from llmgw.core.validation import check_args, check_env
from llmgw.engines import engine as engines
from llmgw.engines.registry import engine_named
from llmgw.errors import LlmgwError
from llmgw.protocol import agent_pb2 as pb

log = logging.getLogger(__name__)

HEALTH_POLL_S = 0.25
LOG_TAIL_BYTES = 2000

Prepare = Callable[[pb.StartShard], Awaitable[Prepared]]
"""Returns what a shard's engine starts from, installing and fetching as needed."""
Report = Callable[[pb.ShardStatus], None]


@dataclass
class Shard:
    spec: pb.StartShard
    directory: Path
    state: pb.ShardState.ValueType = pb.SHARD_STATE_STARTING
    port: int = 0
    error: str = ""
    restarts: int = 0
    compute: pb.Compute = field(default_factory=pb.Compute)
    process: asyncio.subprocess.Process | None = None
    task: asyncio.Task[None] | None = None
    stopping: bool = False
    kv_events_port: int | None = None
    """Where the engine publishes its KV events (vLLM with kv_events), while it runs."""

    @property
    def replica_id(self) -> str:
        return self.spec.replica_id

    @property
    def log_path(self) -> Path:
        return self.directory / "engine.log"

    def status(self) -> pb.ShardStatus:
        return pb.ShardStatus(
            replica_id=self.replica_id,
            state=self.state,
            port=self.port,
            compute=self.compute,
            error=self.error,
            restarts=self.restarts,
        )

    def running(self) -> pb.RunningShard:
        return pb.RunningShard(
            replica_id=self.replica_id,
            model=self.spec.model,
            state=self.state,
            port=self.port,
            compute=self.compute,
            error=self.error,
        )


def free_port(first: int, last: int, taken: set[int], host: str = "127.0.0.1") -> int:
    """A port in [first, last] nobody listens on and no shard of ours holds."""
    for port in range(first, last + 1):
        if port in taken:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    raise LlmgwError(f"no free port in {first}-{last}", "widen ports.first/ports.last in agent.yaml")


def _device_index(name: str) -> int:
    """``CUDA0`` → 0, ``Vulkan1`` → 1 (-1 when the name carries no number)."""
    digits = "".join(ch for ch in name if ch.isdigit())
    return int(digits) if digits else -1


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
            lines = handle.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(lines[-3:])


class Supervisor:
    """All shards of this node."""

    def __init__(
        self,
        work_dir: Path,
        settings: ShardSettings,
        prepare: Prepare,
        *,
        ports: tuple[int, int] = (21000, 21999),
        host: str = "127.0.0.1",
        device_uuids: dict[int, str] | None = None,
    ) -> None:
        self._work_dir = work_dir
        self._device_uuids = device_uuids or {}
        self._settings = settings
        self._prepare = prepare
        self._ports = ports
        self._host = host
        self.shards: dict[str, Shard] = {}
        self.report: Report = lambda status: None
        self._http: aiohttp.ClientSession | None = None
        self._pdeathsig = shutil.which("setpriv")

    def snapshot(self) -> list[pb.RunningShard]:
        return [shard.running() for shard in self.shards.values()]

    def _emit(self, shard: Shard, state: pb.ShardState.ValueType, error: str = "") -> None:
        shard.state = state
        shard.error = error
        self.report(shard.status())

    def start(self, spec: pb.StartShard) -> None:
        """Start a shard, or leave one already running for that replica as it is."""
        existing = self.shards.get(spec.replica_id)
        if existing is not None and not existing.stopping:
            if existing.state == pb.SHARD_STATE_FAILED and existing.task is not None and existing.task.done():
                del self.shards[spec.replica_id]
            else:
                self.report(existing.status())
                return
        shard = Shard(spec=spec, directory=self._work_dir / "shards" / spec.replica_id)
        self.shards[spec.replica_id] = shard
        shard.task = asyncio.create_task(self._supervise(shard), name=f"shard-{spec.replica_id}")

    async def stop(self, replica_id: str, reason: str = "") -> None:
        shard = self.shards.get(replica_id)
        if shard is None:
            return
        shard.stopping = True
        log.info("stopping shard %s%s", replica_id, f": {reason}" if reason else "")
        await self._terminate(shard)
        if shard.task is not None:
            shard.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await shard.task
        self.shards.pop(replica_id, None)
        self._emit(shard, pb.SHARD_STATE_STOPPED, reason)
        shutil.rmtree(shard.directory, ignore_errors=True)

    async def stop_all(self) -> None:
        await asyncio.gather(*(self.stop(replica_id, "agent stopping") for replica_id in list(self.shards)))
        if self._http is not None:
            await self._http.close()

    async def _terminate(self, shard: Shard) -> None:
        process = shard.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), self._settings.stop_grace_s)
        except TimeoutError:
            log.warning(
                "shard %s did not stop within %.0f s of SIGTERM: killing it",
                shard.replica_id,
                self._settings.stop_grace_s,
            )
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()

    async def _supervise(self, shard: Shard) -> None:
        self._emit(shard, pb.SHARD_STATE_STARTING)
        try:
            check_refusals(shard.spec)
            prepared = await self._prepare(shard.spec)
        except LlmgwError as error:
            log.error("shard %s cannot start: %s", shard.replica_id, error)
            self._emit(shard, pb.SHARD_STATE_FAILED, str(error))
            return
        backoff = Backoff(self._settings.restart_backoff_s, 2.0, self._settings.restart_backoff_max_s)
        quick_failures = 0
        while not shard.stopping:
            try:
                ready = await self._launch_once(shard, prepared)
            except LlmgwError as error:
                log.error("shard %s cannot start: %s", shard.replica_id, error)
                self._emit(shard, pb.SHARD_STATE_FAILED, str(error))
                return
            if shard.stopping:
                return
            code = shard.process.returncode if shard.process else None
            reason = f"engine exited with code {code}: {_tail(shard.log_path)}"
            quick_failures = 0 if ready else quick_failures + 1
            shard.restarts += 1
            if quick_failures >= self._settings.max_quick_restarts:
                log.error(
                    "shard %s failed %d times in a row; giving up: %s",
                    shard.replica_id,
                    quick_failures,
                    reason,
                )
                self._emit(shard, pb.SHARD_STATE_FAILED, reason)
                return
            if ready:
                backoff.reset()
            delay = backoff.next_delay()
            log.warning("shard %s: %s; restarting in %.1f s", shard.replica_id, reason, delay)
            self._emit(shard, pb.SHARD_STATE_STARTING, reason)
            await asyncio.sleep(delay)

    async def _launch_once(self, shard: Shard, prepared: Prepared) -> bool:
        """Run the engine once; True when it became ready before it ended."""
        spec = shard.spec
        engine = engine_named(spec.engine)
        taken = {s.port for s in self.shards.values() if s is not shard}
        shard.port = free_port(*self._ports, taken, self._host)
        kv_port = free_port(*self._ports, taken | {shard.port}, self._host) if spec.kv_events else None
        shard.kv_events_port = kv_port
        launch = engines.Launch(
            weights=prepared.weights,
            port=shard.port,
            api_key=spec.api_key,
            model=spec.model,
            host=self._host,
            ctx_size=spec.ctx_size or 4096,
            parallel=spec.parallel or 1,
            tp=spec.tp or max(1, len(spec.devices)),
            args=tuple(spec.args),
            projector=prepared.projector,
            kv_events_port=kv_port,
            max_loaded_adapters=spec.max_loaded_adapters,
            devices=tuple(spec.devices),
        )
        binary = prepared.program
        command = engine.command_line(binary, launch)
        if self._pdeathsig:
            command = [self._pdeathsig, "--pdeathsig", "TERM", "--", *command]
        shard.directory.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(shard.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        env = {**os.environ, **dict(spec.env), **engine.environment(launch)}
        try:
            env.update(visible_devices(tuple(spec.devices), self._device_uuids))
        except ValueError as error:
            hint = "place the replica again ('llmgw ctl replicas' shows where it went)"
            raise LlmgwError(str(error), hint) from None
        try:
            shard.process = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=descriptor,
                stderr=descriptor,
                cwd=shard.directory,
                env=env,
            )
        except OSError as error:
            self._emit(shard, pb.SHARD_STATE_FAILED, f"cannot start {binary}: {error.strerror}")
            shard.stopping = True
            return False
        finally:
            os.close(descriptor)
        log.info("shard %s: engine pid %d on port %d", shard.replica_id, shard.process.pid, shard.port)
        self._emit(shard, pb.SHARD_STATE_STARTING)
        ready = await self._wait_healthy(shard, engine)
        if ready:
            computed = engine.parse_compute(shard.log_path.read_text(errors="replace"), launch)
            shard.compute = pb.Compute(
                backend=computed.backend,
                devices=[_device_index(name) for name in computed.devices],
                layers_offloaded=computed.layers_offloaded or 0,
            )
            self._emit(shard, pb.SHARD_STATE_READY)
        elif shard.process.returncode is None and not shard.stopping:
            log.error(
                "shard %s not healthy after %.0f s: stopping its engine",
                shard.replica_id,
                self._settings.health_timeout_s,
            )
            await self._terminate(shard)
        await shard.process.wait()
        return ready

    async def _wait_healthy(self, shard: Shard, engine: engines.Engine) -> bool:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        process = shard.process
        assert process is not None
        base = f"http://{self._host}:{shard.port}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.health_timeout_s
        while process.returncode is None and not shard.stopping and loop.time() < deadline:
            if await engines.health(engine, self._http, base, shard.spec.api_key):
                return True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(process.wait()), HEALTH_POLL_S)
        return False


def check_refusals(spec: pb.StartShard) -> None:
    """Check the profile's args and env again on the node (C4.5); LlmgwError naming each refusal."""
    engine = engine_named(spec.engine)
    refusals = check_args(engine.name, list(spec.args)) + check_env(engine.name, dict(spec.env))
    if refusals:
        raise LlmgwError(
            f"this node refuses to start {spec.model}: " + "; ".join(str(r) for r in refusals),
            "fix the model's profile (llmgw ctl model add) and the control plane restarts it",
        )
