"""Running batches: the leader sends each batch's requests through its gateway on spare capacity.

:meth:`BatchRunner.run` is a leader duty. Every batch not ended gets a task
of its own that carries it on from the status the store has:

- ``validating``: its input file is read and checked; its requests are
  written (all pending) and it is ``in_progress`` — or ``failed``, saying
  which line is wrong and why;
- ``in_progress``: its pending requests are sent through this plane's
  gateway as the key that made the batch (:mod:`llmgw.gateway.inprocess`),
  so limits, routing and usage count them like any request. Interactive
  traffic comes first: a request is sent only while the model's replicas
  have :class:`~llmgw.core.batches.Headroom` under ``share`` of their slots.
  An answer the gateway could not give for capacity (429, 502, 503, 504) is
  sent again later; any other is the request's result, kept at once;
- every request answered: ``finalizing``, its output and error files
  written, ``completed``. Past its window: what is still pending is answered
  ``batch_expired`` and it ends ``expired``. Cancelled: in-flight requests
  finish, the rest are answered ``batch_cancelled``, it ends ``cancelled``.

A new leader does the same from what the store holds, so a batch loses
nothing to a failover but the requests that were in flight, which are sent
again; the store keeps one answer per ``custom_id``
(:meth:`~llmgw.store.batches.Batches.answer`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from starlette.types import ASGIApp

from llmgw.controlplane.config import BatchSettingsFile
from llmgw.controlplane.serving.batchbook import BatchFiles
from llmgw.core.batches import (
    BatchInputError,
    BatchStatus,
    headroom,
    jsonl,
    parse_input,
    result_line,
    unanswered_line,
)
from llmgw.errors import Conflict
from llmgw.gateway.inprocess import answer_in_process
from llmgw.gateway.keys import KeyRing
from llmgw.gateway.loads import LoadReader
from llmgw.gateway.replicas import ReplicaTable
from llmgw.store.batches import DONE, Batches, BatchRecord, PendingRequest

log = logging.getLogger(__name__)

CANCELLED_WHY = "the batch was cancelled before this request was sent"
EXPIRED_WHY = "the batch's completion window ended before this request was answered"
REVOKED_WHY = "the key that made the batch was revoked"

SWEEP_S = 60.0
"""How often ended batches past their keeping are looked for."""

RETRIED = frozenset({429, 502, 503, 504})
"""Statuses that say "not now" (limits, no replica, capacity): the request is sent again later."""


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """How the leader runs batches (``server.yaml``'s ``batches``: :meth:`of`)."""

    share: float = 0.25
    """Part of a model's slots batch requests may fill, interactive ones counted first."""
    most_at_once: int = 16
    """Most requests of one batch in flight at once, whatever the headroom."""
    look_s: float = 0.05
    """How often a batch waiting for headroom looks again (sooner when one of its requests ends)."""
    retry_s: float = 2.0
    """How long a request answered "not now" waits before it is sent again."""
    poll_s: float = 1.0
    """How often the leader looks for new batches and cancellations."""
    fresh_s: float = 0.1
    """How old a model's engine load may be when a batch request is sent for it: older, it is read
    again first (a model of at most four replicas; ``LoadReader.read_now``); and how long reads must
    have found interactive traffic under the share before one is sent."""
    kept_s: float = 30 * 24 * 3600.0
    """How long an ended batch is kept."""

    @classmethod
    def of(cls, config: BatchSettingsFile) -> BatchSettings:
        return cls(
            share=config.share, most_at_once=config.most_at_once, retry_s=config.retry_s, kept_s=config.kept_s
        )


class BatchRunner:
    """Carries every unended batch on to its end; one task per batch."""

    def __init__(
        self,
        batches: Batches,
        files: BatchFiles,
        gateway: ASGIApp,
        keys: KeyRing,
        replicas: ReplicaTable,
        now: Callable[[], datetime],
        settings: BatchSettings = BatchSettings(),
        loads: LoadReader | None = None,
    ) -> None:
        self.batches = batches
        self.files = files
        self.gateway = gateway
        self.keys = keys
        self.replicas = replicas
        self.loads = loads
        """Reads a model's engine load afresh before a request is sent for it (None: the table's
        reading, up to ``gateway``'s load interval old)."""
        self.now = now
        """The store's clock: a batch's window is on it."""
        self.settings = settings
        self._running: dict[str, asyncio.Task[None]] = {}
        self._next_sweep = 0.0

    async def run(self) -> None:
        """Run until cancelled: new batches are picked up within ``poll_s``."""
        try:
            while True:
                for batch in await self.batches.unended():
                    task = self._running.get(batch.id)
                    if task is None or task.done():
                        self._running[batch.id] = asyncio.create_task(
                            self._carry_on(batch), name=f"batch {batch.id}"
                        )
                for batch_id in [b for b, task in self._running.items() if task.done()]:
                    del self._running[batch_id]
                await self._sweep()
                await asyncio.sleep(self.settings.poll_s)
        finally:
            running = list(self._running.values())
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            self._running.clear()

    async def _sweep(self) -> None:
        """Remove batches ended longer ago than ``kept_s`` (looked at once a minute at most)."""
        loop = asyncio.get_running_loop()
        if loop.time() < self._next_sweep:
            return
        self._next_sweep = loop.time() + SWEEP_S
        removed = await self.batches.delete_ended_before(self.now() - timedelta(seconds=self.settings.kept_s))
        if removed:
            log.info("removed %d batches ended more than %g s ago", removed, self.settings.kept_s)

    async def _carry_on(self, batch: BatchRecord) -> None:
        try:
            await BatchRun(self, batch).run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("batch %s stopped; the next pass carries it on", batch.id)


class BatchRun:
    """One batch carried on by one leader, from the status the store has to its end."""

    def __init__(self, runner: BatchRunner, batch: BatchRecord) -> None:
        self.runner = runner
        self.batches = runner.batches
        self.settings = runner.settings
        self.batch = batch
        self.in_flight: dict[int, asyncio.Task[None]] = {}
        self.by_model: dict[str, int] = {}
        self.not_before: dict[int, float] = {}
        """Requests answered "not now": when they may be sent again (loop time)."""
        self.taken: set[int] = set()
        """Requests sent by this run and not to be sent again: in flight, or answered (a read of the
        pending ones that began before an answer was kept still lists it)."""
        self.read_at: dict[str, float] = {}
        """When each model's engine load was last read afresh (loop time)."""
        self.changed = True
        """A request ended since the pending ones were last read from the store."""
        self.quiet_since: dict[str, float] = {}
        """Since when every fresh read of each model's engines found interactive traffic under the
        share (loop time): a batch request is sent only once two reads ``fresh_s`` apart did, so a
        read that fell between two interactive requests of a busy client lets none through."""

    async def run(self) -> None:
        try:
            while not self.batch.status.ended:
                status = self.batch.status
                try:
                    if status is BatchStatus.VALIDATING:
                        await self._validate()
                    elif status is BatchStatus.IN_PROGRESS:
                        await self._send_all()
                    elif status is BatchStatus.CANCELLING:
                        await self._wait_in_flight()
                        await self._finalize(
                            BatchStatus.CANCELLED, "batch_cancelled", "the batch was cancelled"
                        )
                    elif await self._expired():
                        await self._finalize(
                            BatchStatus.EXPIRED, "batch_expired", "the batch's window ended first"
                        )
                    else:
                        await self._finalize(BatchStatus.COMPLETED, "", "")
                except Conflict:  # its status moved meanwhile (cancelled through another plane)
                    self.batch = await self.batches.get(self.batch.id)
        finally:
            for task in self.in_flight.values():
                task.cancel()

    def _past_window(self) -> bool:
        return self.runner.now() >= self.batch.expires_at

    async def _expired(self) -> bool:
        return self._past_window() and bool(await self.batches.pending(self.batch.id, 1))

    async def _validate(self) -> None:
        batch = self.batch
        data = await self.runner.files.batch_input(batch.owner, batch.input_file_id)
        try:
            if data is None:
                raise BatchInputError(0, f"the input file {batch.input_file_id} is gone")
            lines = parse_input(data, batch.endpoint)
        except BatchInputError as error:
            found = {
                "code": "invalid_request",
                "message": error.message,
                "param": None,
                "line": error.line or None,
            }
            self.batch = await self.batches.move(batch.id, BatchStatus.FAILED, errors=[found])
            log.info("batch %s failed validation: %s", batch.id, error)
            return
        await self.batches.add_requests(batch.id, lines)
        self.batch = await self.batches.move(batch.id, BatchStatus.IN_PROGRESS)
        log.info("batch %s: %d requests, in progress", batch.id, len(lines))

    async def _send_all(self) -> None:
        """Send the pending requests until none is left, the batch is cancelled or its window ends."""
        loop = asyncio.get_running_loop()
        window = self.settings.most_at_once * 4
        last_look = loop.time()
        pending: list[PendingRequest] = []
        while True:
            if loop.time() - last_look >= self.settings.poll_s:
                last_look = loop.time()
                self.changed = True
                self.batch = await self.batches.get(self.batch.id)
                if self.batch.status is not BatchStatus.IN_PROGRESS:
                    return  # cancelling: the requests in flight end, the rest are not sent
            if self._past_window():
                await self._wait_in_flight()
                self.batch = await self.batches.move(self.batch.id, BatchStatus.FINALIZING)
                return
            # the store is asked again once a request ended (or every poll_s), not at every look:
            # a batch waiting for headroom costs its engine's cores nothing but the fresh reads
            pending = [p for p in pending if p.position not in self.taken]
            if self.changed or not pending:
                self.changed = False
                pending = [
                    p
                    for p in await self.batches.pending(self.batch.id, window + len(self.in_flight))
                    if p.position not in self.taken
                ]
                if not pending and not self.in_flight:
                    self.batch = await self.batches.move(self.batch.id, BatchStatus.FINALIZING)
                    return
            now = loop.time()
            for request in pending:
                if self.not_before.get(request.position, 0.0) <= now and await self._may_send(request.model):
                    self._send(request)
            waiting = set(self.in_flight.values())
            if waiting:
                await asyncio.wait(waiting, timeout=self.settings.look_s, return_when=asyncio.FIRST_COMPLETED)
            else:
                await asyncio.sleep(self.settings.look_s)

    async def _may_send(self, model: str) -> bool:
        if len(self.in_flight) >= self.settings.most_at_once:
            return False
        read = await self._fresh(model)
        mine = self.by_model.get(model, 0)
        load = self.runner.replicas.model_load(model)
        if load.slots == 0:  # none ready: one request asks for a replica (on demand) and waits for it
            return mine == 0
        room = headroom(load.slots, load.running + load.waiting, mine, self.settings.share)
        if self.runner.loads is None:
            return room.allowed > 0
        now = asyncio.get_running_loop().time()
        if read:
            if room.interactive < max(1, int(room.slots * room.share)):
                self.quiet_since.setdefault(model, now)
            else:
                self.quiet_since.pop(model, None)
        since = self.quiet_since.get(model)
        return room.allowed > 0 and since is not None and now - since >= self.settings.fresh_s

    async def _fresh(self, model: str) -> bool:
        """The model's engine load read again when the last read is older than ``fresh_s`` (whether
        it was): an interactive request that began since is then seen before a batch request joins
        it (on a CPU engine, the one it would slow most)."""
        loads = self.runner.loads
        now = asyncio.get_running_loop().time()
        if loads is None or now - self.read_at.get(model, -self.settings.fresh_s) < self.settings.fresh_s:
            return False
        self.read_at[model] = now
        return await loads.read_now(model)

    def _send(self, request: PendingRequest) -> None:
        model = request.model
        self.by_model[model] = self.by_model.get(model, 0) + 1
        self.taken.add(request.position)
        task = asyncio.create_task(self._answer(request), name=f"batch {self.batch.id} #{request.position}")
        self.in_flight[request.position] = task

        def ended(done: asyncio.Task[None]) -> None:
            self.in_flight.pop(request.position, None)
            self.by_model[model] -= 1
            self.changed = True
            if not done.cancelled() and done.exception() is not None:  # the store failed: send it again
                log.warning("batch %s request %s: %s", self.batch.id, request.custom_id, done.exception())
                self.taken.discard(request.position)
                self.not_before[request.position] = asyncio.get_running_loop().time() + self.settings.retry_s

        task.add_done_callback(ended)

    async def _answer(self, request: PendingRequest) -> None:
        batch = self.batch
        key = self.runner.keys.get(batch.key_id)
        request_id = f"{batch.id}-{request.position}"
        if key is None:
            line = unanswered_line(
                request.custom_id, "invalid_api_key", "the key that made the batch was revoked"
            )
            await self.batches.answer(batch.id, request.position, ok=False, result=line)
            return
        body = json.dumps(request.body, separators=(",", ":")).encode()
        answer = await answer_in_process(self.runner.gateway, key, batch.endpoint, body, request_id)
        if answer.status in RETRIED:
            self.not_before[request.position] = asyncio.get_running_loop().time() + self.settings.retry_s
            self.taken.discard(request.position)
            return
        try:
            parsed: Any = json.loads(answer.body)
        except ValueError:
            parsed = {"error": {"message": answer.body.decode("utf-8", "replace")}}
        ok = 200 <= answer.status < 300
        prompt, completion = _tokens(parsed) if ok else (0, 0)
        line = result_line(request.custom_id, answer.status, parsed, request_id)
        await self.batches.answer(
            batch.id, request.position, ok=ok, result=line, input_tokens=prompt, output_tokens=completion
        )

    async def _wait_in_flight(self) -> None:
        if self.in_flight:
            await asyncio.gather(*self.in_flight.values(), return_exceptions=True)

    async def _finalize(self, to: BatchStatus, code: str, why: str) -> None:
        """Answer what is pending with ``code`` (when it ends so), write the files, end as ``to``."""
        batch = self.batch
        if code:
            while pending := await self.batches.pending(batch.id, 500):
                for request in pending:
                    line = unanswered_line(request.custom_id, code, why)
                    await self.batches.answer(batch.id, request.position, ok=False, result=line)
        done: list[dict[str, Any]] = []
        failed: list[dict[str, Any]] = []
        for state, line in await self.batches.results(batch.id):
            (done if state == DONE else failed).append(line)
        files = self.runner.files
        output = (
            await files.write_output(batch.owner, f"{batch.id}_output.jsonl", jsonl(done)) if done else ""
        )
        errors = (
            await files.write_output(batch.owner, f"{batch.id}_error.jsonl", jsonl(failed)) if failed else ""
        )
        self.batch = await self.batches.move(batch.id, to, output_file_id=output, error_file_id=errors)
        log.info("batch %s %s: %d answered, %d failed", batch.id, to.value, len(done), len(failed))


def _tokens(body: Any) -> tuple[int, int]:
    """Prompt and completion tokens of an answer's ``usage`` (chat, embeddings or Responses)."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0, 0
    prompt = usage.get("prompt_tokens", usage.get("input_tokens", 0))
    completion = usage.get("completion_tokens", usage.get("output_tokens", 0))
    return (prompt if isinstance(prompt, int) else 0), (completion if isinstance(completion, int) else 0)
