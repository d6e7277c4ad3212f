"""Training jobs on this node: run the trainer, report it, hand its files over, then forget them.

The control plane sends :class:`StartTraining`; the node runs one job at a
time (a second is answered ``FAILED`` saying which job runs) and never runs
one attempt twice (the same job and attempt again is answered with its
status). A job is prepared (the training environment, the base model's
files, llama.cpp's conversion script: :mod:`llmgw.agent.trainingprep`), then
the trainer (:mod:`llmgw.training.trainer`) runs as a process group of its own
as the engines' user, on the device the job was given. Its JSON lines become
:class:`TrainingStatus` (step, loss, peak memory), its other lines the job's
log, sent batched at most every :data:`LOG_BATCH_S`. A trainer that exits
without a result fails the job with its last lines.

The results stay in ``<work>/training/<job>/out/`` until the control plane
has every file (:class:`TrainingFetch` answered a piece at a time with
:class:`TrainingPiece`: :mod:`llmgw.agent.trainingfiles`) and says
:class:`TrainingCollected`. Every job held is
reported again after each registration.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import shutil
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from llmgw.agent import trainingfiles
from llmgw.agent.engineuser import EngineUser
from llmgw.core.agentstream import AgentMessage
from llmgw.core.mig import parse_device_label, visible_devices
from llmgw.core.trainingstream import (
    CancelTraining,
    StartTraining,
    TrainingCollected,
    TrainingFetch,
    TrainingPiece,
    TrainingState,
    TrainingStatus,
)
from llmgw.errors import LlmgwError

log = logging.getLogger(__name__)

LOG_BATCH_S = 0.5
"""New log lines go up at most this often."""
TAIL_LINES = 20
"""The trainer's last lines told when it fails."""
STOP_GRACE_S = 5.0
ENDED = (TrainingState.FINISHED, TrainingState.FAILED, TrainingState.CANCELLED)


@dataclass(frozen=True)
class TrainerInputs:
    """What the trainer runs from, prepared for a job."""

    python: Path
    """The training environment's python."""
    trainer: Path
    """The trainer script, run by path."""
    base: Path
    """The base model's folder."""
    convert_lora: Path | None = None
    """llama.cpp's convert_lora_to_gguf.py (a job that asks for a GGUF)."""


Prepare = Callable[[StartTraining, Callable[[str], None]], Awaitable[TrainerInputs]]
"""Prepare a job's inputs, telling what it does (``fetching weights``) as it goes."""


@dataclass
class Job:
    start: StartTraining
    status: TrainingStatus
    folder: Path
    task: asyncio.Task[None] | None = None
    process: asyncio.subprocess.Process | None = None
    pending: list[str] = field(default_factory=list)
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    flushing: asyncio.Task[None] | None = None


class TrainingJobs:
    """The node's training jobs; answers go out through ``send``."""

    def __init__(
        self,
        node_id: str,
        work_dir: Path,
        prepare: Prepare,
        send: Callable[[AgentMessage], None],
        engine_user: EngineUser | None = None,
        device_uuids: dict[int, str] | None = None,
    ) -> None:
        self._node_id = node_id
        self._root = work_dir / "training"
        self._prepare = prepare
        self._send = send
        self._user = engine_user
        self._uuids = device_uuids or {}
        self.jobs: dict[str, Job] = {}

    def handle(self, message: StartTraining | CancelTraining | TrainingFetch | TrainingCollected) -> None:
        match message:
            case StartTraining():
                self._start(message)
            case CancelTraining():
                self._cancel(message)
            case TrainingFetch():
                self._send(self._piece(message))
            case TrainingCollected():
                self._collected(message.job_id)

    def resend(self) -> None:
        """Report every job held (after a registration: the control plane may have missed a change)."""
        for job in self.jobs.values():
            self._send(job.status)

    async def stop_all(self) -> None:
        """Stop every running trainer (the agent stops)."""
        for job in list(self.jobs.values()):
            if job.task is not None and not job.task.done():
                job.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await job.task

    # --- starting ----------------------------------------------------------------------------

    def _start(self, start: StartTraining) -> None:
        held = self.jobs.get(start.job_id)
        if held is not None and held.start.attempt == start.attempt:
            self._send(held.status)  # told again after a reconnect: never run twice
            return
        running = next((j for j in self.jobs.values() if j.status.state not in ENDED), None)
        if running is not None:
            self._send(
                TrainingStatus(
                    start.job_id,
                    start.attempt,
                    TrainingState.FAILED,
                    error=f"node {self._node_id} is running training job {running.start.job_id}; "
                    "a node runs one job at a time: place this one on another node or after it ends",
                )
            )
            return
        if held is not None:  # a new attempt of a job that ended here
            self._remove(held)
        folder = self._root / start.job_id
        job = Job(start, TrainingStatus(start.job_id, start.attempt, TrainingState.PREPARING), folder)
        self.jobs[start.job_id] = job
        self._send(job.status)
        job.task = asyncio.create_task(self._run(job), name=f"training {start.job_id}")

    async def _run(self, job: Job) -> None:
        try:
            await self._train(job)
        except asyncio.CancelledError:
            await self._terminate(job)
            if job.status.state not in ENDED:
                self._update(job, state=TrainingState.CANCELLED, error="the agent stopped")
            raise
        except (LlmgwError, OSError, ValueError) as error:
            log.warning("training job %s failed: %s", job.start.job_id, error)
            self._update(job, state=TrainingState.FAILED, error=str(error))
        except Exception as error:  # never leave a job preparing for ever: say what broke
            log.exception("training job %s failed", job.start.job_id)
            what = f"{type(error).__name__}: {error}"
            self._update(
                job, state=TrainingState.FAILED, error=f"the node failed the job: {what} (report this)"
            )

    async def _train(self, job: Job) -> None:
        start = job.start
        await asyncio.to_thread(self._make_folder, job)
        inputs = await self._prepare(start, lambda detail: self._update(job, detail=detail))
        environment, device = self._device(start.device)
        out = job.folder / "out"
        args = [
            str(inputs.python), str(inputs.trainer), "--base", str(inputs.base),
            "--pairs", str(job.folder / "pairs.jsonl"), "--options", start.options,
            "--out", str(out), "--device", device,
        ]  # fmt: skip
        if start.gguf:
            if inputs.convert_lora is None:
                raise LlmgwError(
                    "the job asks for a GGUF adapter, but this node has no llama.cpp conversion script",
                    "install the llama.cpp build on the node ('llmgw engine install'), then retry the job",
                )
            args += ["--convert-lora", str(inputs.convert_lora)]
        env = {**os.environ, **environment, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        options: dict[str, object] = {"cwd": job.folder}
        if self._user is not None:
            env.update(self._user.environment())
            options = {**self._user.spawn_options(), "cwd": job.folder}
        self._update(job, state=TrainingState.TRAINING, detail="starting the trainer")
        job.process = await asyncio.create_subprocess_exec(
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            env=env,
            limit=1 << 20,
            **options,  # type: ignore[arg-type]
        )
        results: list[str] | None = None
        assert job.process.stdout is not None
        async for raw in job.process.stdout:
            results = self._line(job, raw.decode(errors="replace").rstrip("\n")) or results
        code = await job.process.wait()
        if job.status.state is TrainingState.CANCELLED:
            return
        if code != 0 or results is None:
            said = " | ".join(job.tail) or "no output"
            raise LlmgwError(
                f"the trainer exited with code {code} without a result; its last lines: {said}",
                "read the job's log ('llmgw ctl train logs'), fix its options or pairs, and submit it again",
            )
        files = await asyncio.to_thread(trainingfiles.describe, out, results)
        self._update(job, state=TrainingState.FINISHED, results=files, detail="")

    def _make_folder(self, job: Job) -> None:
        shutil.rmtree(job.folder, ignore_errors=True)
        (job.folder / "out").mkdir(parents=True)
        (job.folder / "pairs.jsonl").write_bytes(job.start.pairs)
        if self._user is not None:
            for path in (job.folder, job.folder / "out", job.folder / "pairs.jsonl"):
                os.chown(path, self._user.uid, self._user.gid)

    def _device(self, device: str) -> tuple[dict[str, str], str]:
        """The trainer's environment and ``--device`` for the job's device (``cpu``, ``0``, ``1/mig0``)."""
        if device in ("", "cpu"):
            return {"CUDA_VISIBLE_DEVICES": ""}, "cpu"
        try:
            return visible_devices((parse_device_label(device),), self._uuids), "cuda"
        except ValueError as error:
            raise LlmgwError(
                f"the job's device {device!r} is not one of this node's: {error}",
                "place the job on a device this node reports ('llmgw ctl nodes')",
            ) from error

    def _line(self, job: Job, line: str) -> list[str] | None:
        """Take one line of the trainer's output; the result's files when it names them."""
        event = None
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                event = json.loads(line)
        if not isinstance(event, dict) or "event" not in event:
            job.tail.append(line)
            job.pending.append(line)
            if job.flushing is None:
                job.flushing = asyncio.create_task(self._flush_later(job))
            return None
        match event["event"]:
            case "progress":
                self._update(
                    job,
                    step=int(event.get("step", 0)),
                    steps=int(event.get("steps", 0)),
                    loss=float(event.get("loss", 0.0)),
                    peak_memory_bytes=int(event.get("peak_memory_bytes", 0)),
                    detail="",
                )
            case "converting":
                self._update(job, state=TrainingState.CONVERTING, detail="making the GGUF adapter")
            case "result":
                return [str(name) for name in event.get("files", [])]
        return None

    async def _flush_later(self, job: Job) -> None:
        await asyncio.sleep(LOG_BATCH_S)
        job.flushing = None
        if job.pending:
            self._update(job)

    def _update(self, job: Job, **changes: object) -> None:
        """Change the job's status and send it, with the log lines not sent yet."""
        lines, job.pending = tuple(job.pending), []
        job.status = replace(job.status, log_lines=(), **changes)  # type: ignore[arg-type]
        self._send(replace(job.status, log_lines=lines))

    # --- cancelling, fetching, forgetting ----------------------------------------------------

    def _cancel(self, cancel: CancelTraining) -> None:
        job = self.jobs.get(cancel.job_id)
        if job is None:
            return
        if job.status.state not in ENDED:
            reason = cancel.reason or "cancelled by the control plane"
            self._update(job, state=TrainingState.CANCELLED, error=reason, detail="")
            if job.task is not None:
                job.task.cancel()
        else:
            self._send(job.status)

    async def _terminate(self, job: Job) -> None:
        process = job.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()

    def _piece(self, fetch: TrainingFetch) -> TrainingPiece:
        job = self.jobs.get(fetch.job_id)
        if job is None:
            return trainingfiles.missing(self._node_id, fetch)
        return trainingfiles.piece(self._node_id, job.folder / "out", job.status.results, fetch)

    def _collected(self, job_id: str) -> None:
        job = self.jobs.get(job_id)
        if job is not None and job.status.state in ENDED:
            self._remove(job)

    def _remove(self, job: Job) -> None:
        self.jobs.pop(job.start.job_id, None)
        shutil.rmtree(job.folder, ignore_errors=True)
