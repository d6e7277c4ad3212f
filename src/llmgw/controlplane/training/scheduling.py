"""The training scheduler: a leader duty that places queued jobs, follows them, and collects results.

Each pass (every ``interval_s``, and at once when woken) it

- places queued jobs in the order they came (:func:`~llmgw.core.trainingplacement.place_training`),
  keeping each one's reasons when nothing fits;
- sends :class:`~llmgw.core.trainingstream.StartTraining` for every job on a node
  once per session of that node: after a reconnect or a failover the agent
  answers with the job's status and never runs an attempt twice;
- fails a job whose node has been away past ``grace_s``, or queues it again
  (placed as a new attempt) while its ``retry`` lasts;
- pulls the results of finished jobs into the mirror (:mod:`~llmgw.controlplane.training.collecting`),
  then sends ``TrainingCollected`` and marks the job succeeded.

Statuses arrive from the nodes' sessions (:meth:`TrainingScheduler.receive`);
progress is written to the store at most every ``progress_every_s`` per job,
a change of state at once. Everything the scheduler acts on is in the store,
so a new leader carries on where the last one stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.controlplane.training.collecting import Pieces, ResultMissing, collect_file
from llmgw.controlplane.training.progress import ended_there, progressed, start_message
from llmgw.core.placement import Placed
from llmgw.core.training import JobState, job_state
from llmgw.core.trainingplacement import HOLDING, TrainingAsk, TrainingHold, TrainingNode, place_training
from llmgw.core.trainingstream import (
    CancelTraining,
    TrainingCollected,
    TrainingFile,
    TrainingPiece,
    TrainingStatus,
)
from llmgw.errors import ChannelClosed, ChecksumMismatch, Conflict, DownloadError, LlmgwError, NotFound
from llmgw.mirror.blobs import BlobStore
from llmgw.protocol.links import ControlLink
from llmgw.store.database import Store
from llmgw.store.training import JobRecord

log = logging.getLogger(__name__)


class TrainingScheduler:
    """Runs training jobs on the nodes while this control plane leads (a supervised leader duty)."""

    def __init__(
        self,
        store: Store,
        fleet: Fleet,
        blobs: BlobStore,
        *,
        interval_s: float = 2.0,
        grace_s: float = 60.0,
        progress_every_s: float = 2.0,
        piece_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._fleet = fleet
        self._blobs = blobs
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.progress_every_s = progress_every_s
        self._clock = clock
        self.pieces = Pieces(piece_timeout_s)
        self._inbox: asyncio.Queue[tuple[str, TrainingStatus]] = asyncio.Queue()
        self._wake = asyncio.Event()
        self._sent: dict[str, ControlLink] = {}
        """Each job's StartTraining, by the node's stream it went on (sent again on a new stream)."""
        self.away: dict[str, float] = {}
        """Jobs whose node is not connected, with when (``clock``) this plane first saw it away."""
        self._written: dict[str, float] = {}
        self._unwritten: dict[str, tuple[int, dict[str, Any]]] = {}
        """Progress held back by the throttle: (attempt, columns), written on the next pass due."""
        self._collecting: dict[str, asyncio.Task[None]] = {}
        self._holds: tuple[TrainingHold, ...] = ()

    def receive(self, node_id: str, message: TrainingStatus | TrainingPiece) -> None:
        """A node's training message (:attr:`~llmgw.controlplane.nodes.sessions.NodeSessions.on_training`)."""
        if isinstance(message, TrainingPiece):
            self.pieces.deliver(message)
            return
        self._inbox.put_nowait((node_id, message))
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        """Pass after pass until cancelled (stopped when this control plane stops leading)."""
        try:
            while True:
                self._wake.clear()
                try:
                    await self.step()
                except LlmgwError as error:
                    log.warning("training pass stopped: %s", error)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.interval_s):
                        await self._wake.wait()
        finally:
            for task in self._collecting.values():
                task.cancel()
            self._collecting.clear()
            self._sent.clear()
            self.away.clear()
            self._holds = ()

    async def step(self) -> None:
        """One pass: statuses heard, jobs on nodes followed, queued ones placed, progress written."""
        while not self._inbox.empty():
            node_id, status = self._inbox.get_nowait()
            await self._on_status(node_id, status)
        jobs = await self._store.training.list(unfinished=True)
        busy = {job.node_id: job.id for job in jobs if job.state.on_node}
        for job in jobs:
            if job.state.on_node:
                await self._follow(job)
        placed: list[Placed] | None = None
        holding = [job for job in jobs if job.state in HOLDING]
        for job in jobs:
            if job.state is JobState.QUEUED:
                placed = placed if placed is not None else await self._replicas()
                sent = await self._place(job, busy, placed)
                if sent is not None:
                    busy[sent.node_id] = job.id
                    holding.append(sent)
        self._holds = tuple(TrainingHold(j.id, j.node_id, j.device, j.memory_mb) for j in holding)
        await self._flush(force=False)

    def holds(self) -> tuple[TrainingHold, ...]:
        """The cards (and host memory) the jobs on nodes hold, as of the last pass: replica placement
        leaves them alone (:attr:`~llmgw.controlplane.replicas.reconciling.Reconciler.training_holds`)."""
        return self._holds

    async def cancel(self, job_id: str, by: str) -> JobRecord:
        """Cancel a job (Conflict once it ended); its node is told at once if it is there."""
        job = await self._store.training.get(job_id)
        if job.state.ended:
            raise Conflict(f"training job {job_id} has already {job.state.value}", "nothing to cancel")
        self._unwritten.pop(job_id, None)
        job = await self._store.training.change(job_id, state=JobState.CANCELLED, error=f"cancelled by {by}")
        task = self._collecting.pop(job_id, None)
        if task is not None:
            task.cancel()
        node = self._fleet.nodes.get(job.node_id) if job.node_id else None
        if node is not None:
            with contextlib.suppress(ChannelClosed):
                await node.channel.send(CancelTraining(job_id=job_id, reason=f"cancelled by {by}"))
        self._sent.pop(job_id, None)
        return job

    async def _replicas(self) -> list[Placed]:
        return [
            Placed(r.model, r.node_id, r.memory_mb, tuple(r.devices), replica_id=r.id)
            for r in await self._store.replicas.list()
        ]

    async def _place(self, job: JobRecord, busy: dict[str, str], placed: list[Placed]) -> JobRecord | None:
        nodes = [
            TrainingNode(node.inventory, dict(node.foreign), busy.get(node_id, ""))
            for node_id, node in sorted(self._fleet.nodes.items())
        ]
        ask = TrainingAsk(job.id, job.memory_mb, job.device_kind, job.node)
        decision = place_training(ask, nodes, placed)
        if not decision.placed:
            if decision.reasons != job.reasons:
                await self._store.training.change(job.id, expect=job.attempt, reasons=decision.reasons)
            return None
        job = await self._store.training.change(
            job.id,
            expect=job.attempt,
            state=JobState.PLACED,
            node_id=decision.node_id,
            device=decision.device,
            attempt=job.attempt + 1,
            reasons="",
        )
        log.info(
            "training job %s placed on %s (%s), attempt %d", job.id, job.node_id, job.device, job.attempt
        )
        await self._follow(job)
        return job

    async def _follow(self, job: JobRecord) -> None:
        node = self._fleet.nodes.get(job.node_id)
        if node is None:
            await self._away_from(job)
            return
        self.away.pop(job.id, None)
        if self._sent.get(job.id) is not node.channel:
            try:
                await node.channel.send(start_message(job))
            except ChannelClosed:
                return
            self._sent[job.id] = node.channel
        if job.state is JobState.COLLECTING and job.results and job.id not in self._collecting:
            task = asyncio.create_task(self._collect(job, node.channel), name=f"collect-{job.id}")
            self._collecting[job.id] = task
            task.add_done_callback(lambda _: self._collecting.pop(job.id, None))

    async def _away_from(self, job: JobRecord) -> None:
        since = self.away.setdefault(job.id, self._clock())
        if self._clock() - since < self.grace_s:
            return
        self.away.pop(job.id, None)
        self._sent.pop(job.id, None)
        gone = f"node {job.node_id} has been away for over {self.grace_s:.0f} s"
        if job.retry > 0:
            await self._store.training.change(
                job.id,
                expect=job.attempt,
                state=JobState.QUEUED,
                node_id="",
                device="",
                retry=job.retry - 1,
                error=f"{gone}: attempt {job.attempt} given up, queued again",
            )
            log.info("training job %s: %s; queued again", job.id, gone)
            return
        await self._store.training.change(
            job.id,
            expect=job.attempt,
            state=JobState.FAILED,
            error=f"{gone} (attempt {job.attempt} is lost): submit the job again, with --retry N to have it "
            "placed again by itself",
        )

    async def _on_status(self, node_id: str, status: TrainingStatus) -> None:
        node = self._fleet.nodes.get(node_id)
        try:
            job = await self._store.training.get(status.job_id)
        except NotFound:
            job = None
        if job is None or job.node_id != node_id:
            if node is not None and not ended_there(status.state):
                with contextlib.suppress(ChannelClosed):
                    await node.channel.send(
                        CancelTraining(status.job_id, "the job does not run on this node")
                    )
            return
        if status.attempt != job.attempt:
            log.info(
                "training job %s: ignored a status of attempt %d (now %d)",
                job.id,
                status.attempt,
                job.attempt,
            )
            return
        if job.state.ended:
            if node is not None and job.state is JobState.SUCCEEDED:
                with contextlib.suppress(ChannelClosed):
                    await node.channel.send(TrainingCollected(job.id))
            elif node is not None and not ended_there(status.state):
                with contextlib.suppress(ChannelClosed):
                    await node.channel.send(CancelTraining(job.id, f"the job is {job.state.value}"))
            return
        held = self._unwritten.get(job.id)
        base = held[1] if held and held[0] == job.attempt else {}
        values = progressed(job, base, status)
        state = job_state(status.state)
        if state is JobState.COLLECTING and job.state is JobState.COLLECTING:
            state = job.state  # a finished job's status again (after a registration): nothing new
        if state is not job.state:
            values["state"] = state
            if state is JobState.COLLECTING:
                values["results"] = [
                    {"sha256": f.sha256, "filename": f.filename, "size": f.size, "collected": 0}
                    for f in status.results
                ]
            if state is JobState.COLLECTING and not status.results:
                state = values["state"] = JobState.FAILED
                values["error"] = "its node reported it finished but named no result: submit the job again"
            elif state is JobState.FAILED:
                values["error"] = (
                    status.error or "the trainer failed without saying why: see 'llmgw ctl train logs'"
                )
            self._unwritten.pop(job.id, None)
            job = await self._store.training.change(job.id, expect=job.attempt, **values)
            self._written[job.id] = self._clock()
            if state is JobState.COLLECTING:
                await self._follow(job)
            return
        self._unwritten[job.id] = (job.attempt, values)
        await self._flush(force=False)

    async def _flush(self, *, force: bool) -> None:
        now = self._clock()
        for job_id, (attempt, values) in list(self._unwritten.items()):
            if not force and now - self._written.get(job_id, float("-inf")) < self.progress_every_s:
                continue
            del self._unwritten[job_id]
            self._written[job_id] = now
            with contextlib.suppress(Conflict, NotFound):
                await self._store.training.change(job_id, expect=attempt, **values)

    async def _collect(self, job: JobRecord, channel: ControlLink) -> None:
        results = [dict(r) for r in job.results]
        try:
            for entry in results:
                result = TrainingFile(entry["sha256"], entry["filename"], int(entry["size"]))
                await collect_file(self.pieces, channel, self._blobs, job.id, result)
                await self._store.blobs.add(result.sha256, result.size, result.filename, "weights")
                entry["collected"] = result.size
            await channel.send(TrainingCollected(job.id))
            await self._store.training.change(
                job.id, expect=job.attempt, state=JobState.SUCCEEDED, results=results
            )
            log.info("training job %s succeeded: %d files collected", job.id, len(results))
        except (ChecksumMismatch, ResultMissing, DownloadError) as error:
            await self._store.training.change(
                job.id,
                expect=job.attempt,
                state=JobState.FAILED,
                error=f"collecting its results: {error.message}",
            )
        except (TimeoutError, ChannelClosed) as error:
            log.info(
                "training job %s: collection stopped (%s); it resumes when the node is back", job.id, error
            )
            self._sent.pop(job.id, None)  # the node is asked again, and answers with its results
        except (Conflict, NotFound):
            return
