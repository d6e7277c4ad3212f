"""Supervising shards: engine processes started, health-checked, restarted and stopped.

Each shard runs one task: prepare (engine build, weights) → launch → wait for
health → READY → keep health-checking until the process ends; a crash
restarts it with backoff, and too many crashes in a row without becoming
ready report it FAILED (the control plane then starts it again later). A
ready engine that does not answer its health check for ``liveness_s`` (a
frozen process) is reported not ready at once, killed with SIGKILL and
restarted. Stopping sends SIGTERM, waits the grace period, then SIGKILL.

Engines are spawned through a :data:`~llmgw.agent.launching.Launcher` (real
processes in production) and time is read from a
:class:`~llmgw.runtime.clock.Clock`, the seams its unit tests drive.
Engines run in their own session and outlive the agent: each shard keeps a
state file (:mod:`llmgw.agent.shardstates`), and an agent that starts again
adopts the engines still running (:meth:`ShardSupervisor.adopt`), health-checks
them and reports them ready, restarting only those that are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

from llmgw.agent.adoptedprocesses import AdoptedProcess
from llmgw.agent.compute import compute_of, memory_held, refusal
from llmgw.agent.config import ShardSettings
from llmgw.agent.engineoutput import OutputFollower, ShardLog, blanked, open_output
from llmgw.agent.engineuser import EngineUser
from llmgw.agent.gpus import GpuSource
from llmgw.agent.healthchecking import HealthChecks
from llmgw.agent.installing import Prepared
from llmgw.agent.launching import (
    EngineSpawn,
    Launcher,
    SubprocessLauncher,
    ended_within,
    write_key_file,
)
from llmgw.agent.metrics import engine_started
from llmgw.agent.shard import Shard, free_port
from llmgw.agent.shardstates import (
    STATE_FILE,
    CorruptState,
    is_engine,
    process_start_time,
    read_state,
    write_state,
)
from llmgw.agent.telemetry import descendants
from llmgw.core.backoff import Backoff
from llmgw.core.mig import visible_devices
from llmgw.core.shards import FetchProgress, RunningShard, ShardSpec, ShardState, ShardStatus
from llmgw.core.validation import check_args, check_env
from llmgw.engines import engine as engines
from llmgw.engines.registry import engine_named
from llmgw.engines.vllm import kv_events_ports
from llmgw.errors import LlmgwError
from llmgw.observability import logcontext
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

LOG_TAIL_BYTES = 2000

Prepare = Callable[[ShardSpec], Awaitable[Prepared]]
"""Returns what a shard's engine starts from, installing and fetching as needed."""
Report = Callable[[ShardStatus], None]


def _tail(path: Path, key: str) -> str:
    """The last lines of an engine's output, for a report: its key blanked (not yet blanked on disk)."""
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
            lines = handle.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return blanked(" | ".join(lines[-3:]), (key,))


class ShardSupervisor:
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
        gpus: GpuSource | None = None,
        engine_user: EngineUser | None = None,
        launcher: Launcher | None = None,
        clock: Clock = SYSTEM_CLOCK,
        traced: Callable[[ShardSpec, ShardState, str], None] = lambda spec, state, error: None,
    ) -> None:
        self._work_dir = work_dir
        self._engine_user = engine_user
        self._gpus = gpus
        self._device_uuids = device_uuids or {}
        self._settings = settings
        self._prepare = prepare
        self._ports = ports
        self._host = host
        self.shards: dict[str, Shard] = {}
        self.report: Report = lambda status: None
        self.traced = traced  # tracing
        self._launch = launcher or SubprocessLauncher()
        self._clock = clock
        self._health = HealthChecks(settings, clock, host)

    def snapshot(self) -> list[RunningShard]:
        return [shard.running() for shard in self.shards.values()]

    def engine_pids(self) -> set[int]:
        """The engines' processes and everything they started (adopted engines included)."""
        pids: set[int] = set()
        for shard in self.shards.values():
            if shard.process is not None and shard.process.returncode is None:
                pids |= descendants(shard.process.pid)
        return pids

    def adopt(self) -> None:
        """Take in the shards an earlier agent left: adopt live engines, restart dead ones.

        A state file that cannot be read leaves its shard stopped, with the
        reason, for the registration to report; the agent carries on.
        """
        root = self._work_dir / "shards"
        for directory in sorted(root.iterdir()) if root.is_dir() else ():
            if not (directory / STATE_FILE).exists():
                continue
            try:
                record = read_state(directory)
            except CorruptState as error:
                log.error("shard %s left stopped: %s", directory.name, error)
                self.shards[directory.name] = Shard(
                    spec=ShardSpec(replica_id=directory.name),
                    directory=directory,
                    state=ShardState.STOPPED,
                    error=str(error),
                )
                continue
            shard = Shard(
                spec=record.spec,
                directory=directory,
                port=record.port,
                compute=record.compute,
                restarts=record.restarts,
                command=record.command,
                start_time=record.start_time,
                output=record.output,
                adapter_paths=record.adapter_paths,
            )
            shard.kv_events_port, shard.kv_replay_port = kv_events_ports(record.command)
            self.shards[shard.replica_id] = shard
            if is_engine(record):
                log.info(
                    "shard %s: adopting its engine, pid %d on port %d",
                    shard.replica_id,
                    record.pid,
                    shard.port,
                )
                shard.process = AdoptedProcess(record.pid, record.start_time)
                self._follow(shard)
                shard.task = asyncio.create_task(
                    self._supervise(shard, adopted=True), name=f"shard-{shard.replica_id}"
                )
            else:
                log.warning(
                    "shard %s: its engine (pid %d) is gone; starting it again", shard.replica_id, record.pid
                )
                shard.task = asyncio.create_task(self._supervise(shard), name=f"shard-{shard.replica_id}")

    def log_of(self, replica_id: str) -> ShardLog | None:
        shard = self.shards.get(replica_id)
        return shard.log if shard is not None else None

    def _follow(self, shard: Shard) -> None:
        """Follow the shard's current output file into its log, from the start."""
        if shard.follower is not None:
            shard.follower.cancel()
        follower = OutputFollower(
            shard.log_path,
            shard.log,
            self._settings.output_max_bytes,
            shard.replica_id,
            secrets=(shard.spec.api_key,),
        )
        shard.reader = follower
        shard.follower = asyncio.create_task(follower.run(), name=f"output-{shard.replica_id}")

    def _save(self, shard: Shard) -> None:
        try:
            write_state(shard.directory, shard.record())
        except OSError as error:
            log.error("shard %s: cannot write its state file: %s", shard.replica_id, error)

    def fetching(self, replica_id: str, progress: FetchProgress) -> None:
        """Report how far a starting shard's files have come (throttled by the caller)."""
        shard = self.shards.get(replica_id)
        if shard is None or shard.stopping or shard.state is not ShardState.STARTING:
            return
        shard.fetching = progress
        self.report(shard.status())

    def _emit(self, shard: Shard, state: ShardState, error: str = "") -> None:
        shard.state = state
        shard.error = error
        shard.fetching = None
        self.traced(shard.spec, state, error)  # a traced start's span: begun, or ended at READY
        self.report(shard.status())

    def start(self, spec: ShardSpec) -> None:
        """Start a shard, or leave one already running for that replica as it is (fetching the new
        adapters of one whose engine loads them at run time: :meth:`_take_adapters`)."""
        existing = self.shards.get(spec.replica_id)
        if existing is not None and not existing.stopping:
            ended = existing.task is None or existing.task.done()
            if ended and existing.state.ended:
                del self.shards[spec.replica_id]
            else:
                if spec.max_loaded_adapters and spec.adapters != existing.spec.adapters:
                    existing.taking = asyncio.create_task(
                        self._take_adapters(existing, spec), name=f"adapters-{spec.replica_id}"
                    )
                else:
                    self.report(existing.status())
                return
        shard = Shard(spec=spec, directory=self._work_dir / "shards" / spec.replica_id)
        self.shards[spec.replica_id] = shard
        shard.task = asyncio.create_task(self._supervise(shard), name=f"shard-{spec.replica_id}")

    async def _take_adapters(self, shard: Shard, spec: ShardSpec) -> None:
        """A running shard's engine loads adapters at run time and its model's changed: fetch them to
        this node and report where they are (the gateway loads each from its path when asked)."""
        try:
            prepared = await self._prepare(spec)
        except LlmgwError as error:
            log.error("shard %s: its model's adapters cannot be fetched: %s", shard.replica_id, error)
            self.report(shard.status())
            return
        except Exception:  # the task is never awaited: what fails here is told, not lost with it
            log.exception("shard %s: its model's adapters could not be taken", shard.replica_id)
            self.report(shard.status())
            return
        shard.spec = dataclasses.replace(shard.spec, adapters=spec.adapters)
        shard.adapter_paths = {a.name: str(a.path) for a in prepared.adapters}
        log.info("shard %s: adapters %s on this node", shard.replica_id, sorted(shard.adapter_paths))
        self._save(shard)
        self.report(shard.status())

    async def stop(self, replica_id: str, reason: str = "") -> None:
        shard = self.shards.get(replica_id)
        if shard is None:
            return
        shard.stopping = True
        log.info("stopping shard %s%s", replica_id, f": {reason}" if reason else "")
        await self._terminate(shard)
        for task in (shard.task, shard.follower, shard.taking):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self.shards.pop(replica_id, None)
        self._emit(shard, ShardState.STOPPED, reason)
        shutil.rmtree(shard.directory, ignore_errors=True)

    async def stop_all(self) -> None:
        await asyncio.gather(*(self.stop(replica_id, "agent stopping") for replica_id in list(self.shards)))
        await self._health.close()

    async def _terminate(self, shard: Shard) -> None:
        process = shard.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        if not await ended_within(process, self._settings.stop_grace_s, self._clock):
            log.warning(
                "shard %s did not stop within %.0f s of SIGTERM: killing it",
                shard.replica_id,
                self._settings.stop_grace_s,
            )
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()

    async def _supervise(self, shard: Shard, adopted: bool = False) -> None:
        """Run a shard's life; an unexpected error fails the shard with its reason, never silently."""
        logcontext.about(model=shard.spec.model, replica=shard.replica_id)  # the shard task's log lines
        try:
            await self._run_shard(shard, adopted)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.exception("shard %s failed unexpectedly", shard.replica_id)
            self._emit(shard, ShardState.FAILED, f"unexpected error in the agent: {error!r}")

    async def _run_shard(self, shard: Shard, adopted: bool) -> None:
        self._emit(shard, ShardState.STARTING)
        if adopted:
            try:
                await self._watch(shard, engine_named(shard.spec.engine), _launch_of(shard.spec, shard.port))
            except LlmgwError as error:
                log.error("shard %s failed: %s", shard.replica_id, error)
                self._emit(shard, ShardState.FAILED, str(error))
                return
            if shard.stopping:
                return
            shard.restarts += 1
            reason = _killed(shard) or f"adopted engine ended: {_tail(shard.log_path, shard.spec.api_key)}"
            log.warning("shard %s: %s; starting it again", shard.replica_id, reason)
            self._emit(shard, ShardState.STARTING, reason)
        try:
            check_refusals(shard.spec)
            prepared = await self._prepare(shard.spec)
            shard.adapter_paths = {a.name: str(a.path) for a in prepared.adapters}
        except LlmgwError as error:
            log.error("shard %s cannot start: %s", shard.replica_id, error)
            self._emit(shard, ShardState.FAILED, str(error))
            return
        if shard.fetching is not None:  # every file is there: the report says starting, not fetching
            shard.fetching = None
            self.report(shard.status())
        backoff = Backoff(self._settings.restart_backoff_s, 2.0, self._settings.restart_backoff_max_s)
        quick_failures = 0
        while not shard.stopping:
            try:
                ready = await self._launch_once(shard, prepared)
            except LlmgwError as error:
                log.error("shard %s cannot start: %s", shard.replica_id, error)
                self._emit(shard, ShardState.FAILED, str(error))
                return
            if shard.stopping:
                return
            code = shard.process.returncode if shard.process else None
            reason = (
                _killed(shard)
                or f"engine exited with code {code}: {_tail(shard.log_path, shard.spec.api_key)}"
            )
            quick_failures = 0 if ready else quick_failures + 1
            shard.restarts += 1
            if quick_failures >= self._settings.max_quick_restarts:
                log.error(
                    "shard %s failed %d times in a row; giving up: %s",
                    shard.replica_id,
                    quick_failures,
                    reason,
                )
                self._emit(shard, ShardState.FAILED, reason)
                return
            if ready:
                backoff.reset()
            delay = backoff.next_delay()
            log.warning("shard %s: %s; restarting in %.1f s", shard.replica_id, reason, delay)
            self._emit(shard, ShardState.STARTING, reason)
            await self._clock.sleep(delay)

    async def _launch_once(self, shard: Shard, prepared: Prepared) -> bool:
        """Run the engine once; True when it became ready before it ended."""
        spec = shard.spec
        engine = engine_named(spec.engine)
        taken = {port for s in self.shards.values() if s is not shard for port in s.ports}
        shard.port = free_port(*self._ports, taken, self._host)
        kv_port = replay_port = None
        if spec.kv_events:
            kv_port = free_port(*self._ports, taken | {shard.port}, self._host)
            replay_port = free_port(*self._ports, taken | {shard.port, kv_port}, self._host)
        shard.kv_events_port, shard.kv_replay_port = kv_port, replay_port
        user = self._engine_user
        owner = (user.uid, user.gid) if user else None
        key_file = write_key_file(shard.directory, engine.capabilities.key_input, spec.api_key, owner)
        launch = engines.Launch(
            weights=prepared.weights,
            port=shard.port,
            api_key=spec.api_key,
            model=spec.model,
            host=self._host,
            ctx_size=spec.ctx_size or 4096,
            parallel=spec.parallel or 1,
            tp=spec.tp or max(1, len(spec.devices)),
            pp=max(1, spec.pp),
            args=tuple(spec.args),
            projector=prepared.projector,
            kv_events_port=kv_port,
            kv_replay_port=replay_port,
            max_loaded_adapters=spec.max_loaded_adapters,
            adapters=() if spec.max_loaded_adapters else prepared.adapters,
            max_lora_rank=spec.max_lora_rank,
            devices=tuple(spec.devices),
            key_file=key_file,
            serves=spec.serves,
            pooling=spec.pooling,
            comfyui_nodes=spec.comfyui_nodes,
            comfyui_hf_repository=spec.comfyui_hf_repository,
            entry=prepared.entry,
            rendezvous=spec.rendezvous,
        )
        binary = prepared.program
        command = engine.command_line(binary, launch)
        previous = shard.log_path if shard.output else None
        shard.output = f"output-{shard.restarts}.log"
        if previous == shard.log_path:
            previous = None
        env = {
            **os.environ,
            **(user.environment() if user else {}),
            **engine.default_environment(launch),
            **dict(spec.env),
            **engine.environment(launch),
        }
        try:
            env.update(visible_devices(tuple(spec.devices), self._device_uuids))
        except ValueError as error:
            hint = "place the replica again ('llmgw ctl replicas' shows where it went)"
            raise LlmgwError(str(error), hint) from None
        descriptor = open_output(shard.log_path)
        spawn = EngineSpawn(
            command,
            env,
            descriptor,
            cwd=None if user else shard.directory,
            options=user.spawn_options() if user else {},
        )
        try:
            shard.process = await self._launch(spawn)
        except OSError as error:
            self._emit(shard, ShardState.FAILED, f"cannot start {binary}: {error.strerror}")
            shard.stopping = True
            return False
        finally:
            os.close(descriptor)
        shard.command = command
        shard.start_time = process_start_time(shard.process.pid) or ""
        log.info("shard %s: engine pid %d on port %d", shard.replica_id, shard.process.pid, shard.port)
        engine_started(spec.engine, again=shard.restarts > 0)
        self._follow(shard)
        if previous is not None:
            previous.unlink(missing_ok=True)
        self._save(shard)
        self._emit(shard, ShardState.STARTING)
        return await self._watch(shard, engine, launch)

    async def _watch(self, shard: Shard, engine: engines.Engine, launch: engines.Launch) -> bool:
        """Wait for health, read where it computes, report READY, wait for the end; True if it was ready.

        LlmgwError (its engine stopped) when it computes on the CPU despite the GPUs it was given.
        """
        process = shard.process
        assert process is not None

        def stopping() -> bool:
            return shard.stopping

        ready = await self._health.first_answer(engine, process, shard.port, shard.spec.api_key, stopping)
        if ready:
            if shard.reader is not None:
                with contextlib.suppress(OSError):
                    shard.reader.poll()  # the key printed at start is blanked before the replica serves
            failure = await self._read_compute(shard, engine, launch)
            if failure:
                log.error("shard %s: %s", shard.replica_id, failure)
                await self._terminate(shard)
                raise LlmgwError(failure, "")
            self._save(shard)
            self._emit(shard, ShardState.READY)
            if not await self._health.stays_live(engine, process, shard.port, shard.spec.api_key, stopping):
                await self._kill_unanswering(shard)
        elif process.returncode is None and not shard.stopping:
            log.error(
                "shard %s not healthy after %.0f s: stopping its engine",
                shard.replica_id,
                self._settings.health_timeout_s,
            )
            await self._terminate(shard)
        await process.wait()
        return ready

    async def _read_compute(self, shard: Shard, engine: engines.Engine, launch: engines.Launch) -> str:
        """Set the shard's compute from its output and the cards; the reason to refuse it, or empty."""
        try:
            output = shard.log_path.read_text(errors="replace")
        except OSError:
            output = ""
        parsed = engine.parse_compute(output, launch)
        failure = refusal(output, parsed, shard.spec.devices)
        if failure:
            return failure
        if shard.compute.backend and shard.process is not None and isinstance(shard.process, AdoptedProcess):
            return ""  # adopted: the compute its state file kept
        report = None
        if self._gpus is not None:
            try:
                report = await self._gpus.read()
            except Exception as error:  # a reader that fails leaves the engine's own word
                log.warning("shard %s: cannot read the cards: %s", shard.replica_id, error)
        pids = descendants(shard.process.pid) if shard.process is not None else set()
        shard.compute = compute_of(parsed, memory_held(report, pids))
        return ""

    async def _kill_unanswering(self, shard: Shard) -> None:
        """Report the shard not ready (the router stops sending to it), then SIGKILL its engine."""
        shard.killed = (
            f"engine stopped answering its health check for {self._settings.liveness_s:g} s "
            f"(shards.liveness_s): killed with SIGKILL"
        )
        log.error("shard %s: %s", shard.replica_id, shard.killed)
        self._emit(shard, ShardState.STARTING, shard.killed)
        process = shard.process
        assert process is not None
        with contextlib.suppress(ProcessLookupError):
            process.kill()  # a stopped (SIGSTOP) process acts on SIGTERM only once continued


def _killed(shard: Shard) -> str:
    """Why the agent killed the shard's last engine, once (empty when it ended by itself)."""
    reason, shard.killed = shard.killed, ""
    return reason


def _launch_of(spec: ShardSpec, port: int) -> engines.Launch:
    """What an adopted engine was launched with, as far as reading its compute needs."""
    return engines.Launch(
        weights=Path(spec.weights_filename or "."),
        port=port,
        api_key=spec.api_key,
        model=spec.model,
        tp=spec.tp or max(1, len(spec.devices)),
        devices=tuple(spec.devices),
    )


def check_refusals(spec: ShardSpec) -> None:
    """Check the profile's args and env again on the node (C4.5); LlmgwError naming each refusal."""
    engine = engine_named(spec.engine)
    refusals = check_args(engine.name, list(spec.args)) + check_env(engine.name, dict(spec.env))
    if refusals:
        raise LlmgwError(
            f"this node refuses to start {spec.model}: " + "; ".join(str(r) for r in refusals),
            "fix the model's profile (llmgw ctl model add) and the control plane restarts it",
        )
