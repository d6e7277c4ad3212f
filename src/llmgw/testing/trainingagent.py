"""A stand-in agent for training jobs: registers on a stream, answers StartTraining with scripted
statuses, and serves TrainingFetch from bytes it holds.

It runs one attempt of a job once: a StartTraining of an attempt it already
has is answered with the job's last status, as the real agent does after a
reconnect. ``hold`` keeps a job at its last scripted status until
:meth:`TrainingAgentStandin.release` (a job mid-way, for failover tests).
The real agent (``llmgw.agent``) replaces it where a test runs the trainer.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmgw.core.devices import Device, NodeInventory
from llmgw.core.nodes import NodeRegistration
from llmgw.core.trainingstream import (
    CancelTraining,
    StartTraining,
    TrainingCollected,
    TrainingFetch,
    TrainingFile,
    TrainingPiece,
    TrainingState,
    TrainingStatus,
)
from llmgw.errors import ChannelClosed
from llmgw.protocol.channels import AgentChannel
from llmgw.protocol.links import AgentLink, agent_link


def results_of(files: Mapping[str, bytes]) -> tuple[TrainingFile, ...]:
    """The result files naming ``files``' bytes by their sha256."""
    return tuple(
        TrainingFile(hashlib.sha256(data).hexdigest(), name, len(data)) for name, data in files.items()
    )


def script(steps: int, files: Mapping[str, bytes], *, peak: int = 1 << 20) -> list[TrainingStatus]:
    """A job that prepares, trains ``steps`` steps with a falling loss, and finishes with ``files``."""
    out = [TrainingStatus("", 0, TrainingState.PREPARING, detail="fetching weights")]
    for step in range(1, steps + 1):
        out.append(
            TrainingStatus(
                "", 0, TrainingState.TRAINING, step, steps, 2.0 / step, peak, log_lines=(f"step {step}",)
            )
        )
    out.append(
        TrainingStatus(
            "", 0, TrainingState.FINISHED, steps, steps, 2.0 / steps, peak, results=results_of(files)
        )
    )
    return out


@dataclass
class StandinJob:
    start: StartTraining
    last: TrainingStatus
    files: dict[str, bytes]
    collected: bool = False
    cancelled: str = ""


@dataclass
class TrainingAgentStandin:
    """One node's agent, as far as training goes."""

    node_id: str
    memory_mb: int = 16384
    cards: Sequence[Device] = ()
    statuses: Sequence[TrainingStatus] = ()
    """What every job reports, in order (``job_id`` and ``attempt`` filled in)."""
    files: Mapping[str, bytes] = field(default_factory=dict)
    """The bytes of the files every job makes, by name."""
    hold: int | None = None
    """Stop after this many statuses until :meth:`release`."""
    corrupt: bool = False
    """Serve flipped bytes (their sha256 no longer matches)."""
    jobs: dict[str, StandinJob] = field(default_factory=dict)
    starts: list[StartTraining] = field(default_factory=list)
    """Every StartTraining received, repeats included."""
    fetches: list[TrainingFetch] = field(default_factory=list)
    _released: asyncio.Event = field(default_factory=asyncio.Event)
    _link: AgentLink | None = None
    _new_link: asyncio.Event = field(default_factory=asyncio.Event)
    _running: set[asyncio.Task[None]] = field(default_factory=set)

    def release(self) -> None:
        self._released.set()

    def stop(self) -> None:
        """End every job's run (they outlive a stream, as the real agent's trainers do)."""
        for task in self._running:
            task.cancel()

    async def serve(self, channel: AgentChannel) -> None:
        """Register on ``channel`` and answer it until it ends."""
        link = agent_link(channel)
        self._link = link
        self._new_link.set()
        self._new_link = asyncio.Event()
        inventory = NodeInventory(self.node_id, "127.0.0.1", 4, self.memory_mb, tuple(self.cards))
        await link.send(NodeRegistration(inventory))
        with contextlib.suppress(ChannelClosed):
            while True:
                message = await link.receive()
                match message:
                    case StartTraining():
                        self.starts.append(message)
                        task = asyncio.create_task(self._start(message))
                        self._running.add(task)
                        task.add_done_callback(self._running.discard)
                    case TrainingFetch():
                        self.fetches.append(message)
                        await link.send(self._piece(message))
                    case TrainingCollected():
                        if message.job_id in self.jobs:
                            self.jobs[message.job_id].collected = True
                    case CancelTraining():
                        job = self.jobs.get(message.job_id)
                        if job is not None:
                            job.cancelled = message.reason or "cancelled"
                            self._released.set()

    async def _send(self, status: TrainingStatus) -> None:
        """Send on the stream of now, or on the next one once this one has ended."""
        while True:
            reconnected = self._new_link
            assert self._link is not None
            try:
                await self._link.send(status)
                return
            except ChannelClosed:
                await reconnected.wait()

    async def _start(self, start: StartTraining) -> None:
        known = self.jobs.get(start.job_id)
        if known is not None and known.start.attempt == start.attempt:
            await self._send(known.last)  # never runs one attempt twice: says where it is
            return
        job = StandinJob(
            start, TrainingStatus(start.job_id, start.attempt, TrainingState.PREPARING), dict(self.files)
        )
        self.jobs[start.job_id] = job
        for index, status in enumerate(self.statuses):
            if self.hold is not None and index >= self.hold:
                await self._released.wait()
            if job.cancelled:
                job.last = TrainingStatus(start.job_id, start.attempt, TrainingState.CANCELLED)
                await self._send(job.last)
                return
            job.last = dataclasses.replace(status, job_id=start.job_id, attempt=start.attempt)
            await self._send(job.last)
            await asyncio.sleep(0)

    def _piece(self, fetch: TrainingFetch) -> TrainingPiece:
        job = self.jobs.get(fetch.job_id)
        data = job.files.get(fetch.filename) if job is not None else None
        if data is None:
            return TrainingPiece(fetch.job_id, fetch.filename, fetch.offset, error="no such job or file here")
        piece = data[fetch.offset : fetch.offset + fetch.length]
        if self.corrupt:
            piece = bytes(b ^ 0xFF for b in piece)
        return TrainingPiece(fetch.job_id, fetch.filename, fetch.offset, piece)
