"""The local channel between a control plane and its gateway workers: a Unix socket in the data dir (0600).

It carries the same gateway state events as the stream to standbys
(:mod:`llmgw.controlplane.gatewaystate`), one JSON object a line:

- the control plane (:class:`WorkerChannelServer`) sends each worker that
  connects a full copy of its :class:`~llmgw.controlplane.gatewaystate.GatewayState`
  (ending with ``live``), then every change; every :data:`TICK_S` it also
  sends ``serves`` when it changed (whether this plane serves ``/v1`` itself:
  it leads, or holds a leader's copy) and, every :data:`COUNT_S`, the day and
  month counts of every limited subject as its own limiter holds them
  (``limits_counted``: the store's counts plus what every worker reported);
- a worker (:class:`WorkerFollowing`) says its pid first (``hello``: a
  restarted control plane knows its own workers serve), then sends back the
  standby stream's requests (``wanted``, ``replica_failed`` at once; ``used``
  once per model every :data:`TICK_S`) and its usage, summed per key, model
  and place and sent every :data:`TICK_S` (``usage_sums``: a line per tick,
  not per request, which the control plane adds to its usage writer or sends
  on to the leader) and, every
  :data:`COUNT_S`, the tokens it counted against limits since the last report
  (``counted``), which the control plane adds to its own meters, so that its
  limit writer stores them and every worker sees them; the samples of its
  gateway metrics (``metrics``, every :data:`COUNT_S` and whenever the
  control plane asks, ``send_metrics``, as a scrape of its ``/metrics`` does:
  :mod:`llmgw.controlplane.workermetrics`); and its requests in flight per
  model and replica (``in_flight``, when they change, looked at every
  :data:`TICK_S`: :class:`WorkerLoads`).

A worker whose channel ends keeps its copy and serves from it, keeps its
requests (at most :data:`PENDING_MAX`) and connects again with backoff; the
control plane then sends a new full copy. Only the owner of the data dir can
connect: the socket is bound under a temporary name, made 0600, then renamed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from llmgw.controlplane.gatewaystate import Event, GatewayState, StateApplier
from llmgw.controlplane.usage_writing import UsageSums
from llmgw.core.backoff import Backoff
from llmgw.gateway.limiting import Limiter
from llmgw.gateway.usage import UsageRecord
from llmgw.runtime.waiting import wait_event, within

log = logging.getLogger(__name__)

SOCKET_NAME = "workers.sock"
"""The channel's socket, in the control plane's data dir."""
LINE_MAX = 1 << 30
"""Longest event line (a full copy's keys or catalog can be large)."""
TICK_S = 0.2
"""How often the control plane looks whether it serves /v1 itself."""
COUNT_S = 1.0
"""How often limit counts go each way."""
METRICS_WAIT_S = 1.0
"""Longest a scrape of ``/metrics`` waits for the workers' fresh samples."""
PENDING_MAX = 100_000
"""Requests a worker keeps while its channel is down; past that the oldest are dropped."""

OnRequest = Callable[[Event], None]


def encode_line(event: Event) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


async def read_event(reader: asyncio.StreamReader) -> Event:
    """The next event; EOFError when the other side closed."""
    line = await reader.readline()
    if not line:
        raise EOFError("the local channel closed")
    event: Event = json.loads(line)
    return event


def limit_totals(limiter: Limiter) -> dict[str, tuple[int, int]]:
    """Each limited subject's day and month counts as ``limiter`` holds them."""
    totals: dict[str, tuple[int, int]] = {}
    for subject in limiter.limits():
        meter = limiter.meter(subject)
        if meter is not None:
            totals[subject] = (meter.day_used, meter.month_used)
    return totals


def add_counted(limiter: Limiter, used: dict[str, int]) -> None:
    """Tokens a worker counted: into this limiter's meters as if counted here (written, then sent on)."""
    for subject, tokens in used.items():
        meter = limiter.meter(subject)
        if meter is not None and tokens > 0:
            meter.unsaved += tokens
            meter.day_used += tokens
            meter.month_used += tokens


def private_unix_socket(path: Path) -> socket.socket:
    """A listening Unix socket at ``path`` that only this user can connect to, from the first connection
    on: bound under a temporary name, made 0600, then renamed into place."""
    temporary = path.with_name(path.name + ".new")
    for leftover in (path, temporary):
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(temporary))
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
        sock.listen(1024)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class WorkerLoads:
    """The requests each connected worker has in flight, per model and per replica, as last reported
    (every :data:`TICK_S` when they change): what the reconciler adds to this plane's own before it
    lets an on-demand model idle or a draining replica stop."""

    def __init__(self) -> None:
        self._reports: dict[int, Event] = {}

    def report(self, worker: int, event: Event) -> None:
        self._reports[worker] = event

    def forget(self, worker: int) -> None:
        self._reports.pop(worker, None)

    def in_flight(self, model: str) -> int:
        return sum(int(r["models"].get(model, 0)) for r in self._reports.values())

    def replica_in_flight(self, replica_id: str) -> int:
        return sum(int(r["replicas"].get(replica_id, 0)) for r in self._reports.values())


class WorkerChannelServer:
    """The control plane's side: a full copy and the changes to each worker; their requests to
    ``on_request``, their limit counts into ``limiter``."""

    def __init__(
        self,
        state: GatewayState,
        limiter: Limiter,
        on_request: OnRequest,
        serves: Callable[[], bool],
        loads: WorkerLoads | None = None,
    ) -> None:
        self.loads = loads if loads is not None else WorkerLoads()
        self._state = state
        self._limiter = limiter
        self._on_request = on_request
        self._serves = serves
        self.connected = 0
        """Workers connected now."""
        self._writers: set[asyncio.StreamWriter] = set()
        self.metrics: dict[int, list[Any]] = {}
        """Each connected worker's last gateway metric samples."""
        self._asked: dict[int, asyncio.Event] = {}
        self.pids: dict[int, int] = {}
        """Each connected worker's pid (it says it first: ``hello``)."""

    async def run(self, path: Path) -> None:
        server = await asyncio.start_unix_server(
            self._connection, sock=private_unix_socket(path), limit=LINE_MAX
        )
        try:
            await asyncio.Future()  # serve until cancelled
        finally:
            server.close()
            for writer in self._writers:  # each worker's channel ends: it connects again
                writer.close()
            path.unlink(missing_ok=True)  # noqa: ASYNC240  # one unlink, on the way out

    async def fresh_metrics(self, timeout_s: float = METRICS_WAIT_S) -> list[list[Any]]:
        """Every connected worker's gateway samples as of now (a scrape counts every request answered
        before it): each is asked, and answers within ``timeout_s`` or its last samples are used."""
        waits = []
        for writer in list(self._writers):
            asked = self._asked.setdefault(id(writer), asyncio.Event())
            waits.append(asked.wait())
            with contextlib.suppress(ConnectionError, RuntimeError):
                writer.write(encode_line({"kind": "send_metrics"}))
        if waits:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), timeout_s)
        return list(self.metrics.values())

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        copy, queue = self._state.subscribe()
        self.connected += 1
        self._writers.add(writer)
        sending = asyncio.ensure_future(self._send(writer, copy, queue))
        taking = asyncio.ensure_future(self._take(reader, id(writer)))
        try:
            await asyncio.wait({sending, taking}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.connected -= 1
            self._writers.discard(writer)
            self.loads.forget(id(writer))
            self.metrics.pop(id(writer), None)
            self.pids.pop(id(writer), None)
            if (asked := self._asked.pop(id(writer), None)) is not None:
                asked.set()
            self._state.unsubscribe(queue)
            for task in (sending, taking):
                task.cancel()
            await asyncio.wait({sending, taking})
            writer.close()

    async def _send(
        self, writer: asyncio.StreamWriter, copy: list[Event], queue: asyncio.Queue[Event]
    ) -> None:
        with contextlib.suppress(ConnectionError):
            serves = self._serves()
            writer.write(b"".join(encode_line(event) for event in copy))
            writer.write(encode_line({"kind": "serves", "serves": serves}))
            await writer.drain()
            loop = asyncio.get_running_loop()
            next_count = loop.time() + COUNT_S
            while True:
                try:
                    event = await within(queue.get(), TICK_S)
                except TimeoutError:
                    event = None
                if event is not None:
                    if event["kind"] == "overflow":
                        return  # the worker connects again and gets a full copy
                    writer.write(encode_line(event))
                    while not queue.empty():  # a burst goes out in one write
                        writer.write(encode_line(queue.get_nowait()))
                if self._serves() != serves:
                    serves = not serves
                    writer.write(encode_line({"kind": "serves", "serves": serves}))
                if loop.time() >= next_count:
                    next_count = loop.time() + COUNT_S
                    if totals := limit_totals(self._limiter):
                        used = {s: list(pair) for s, pair in totals.items()}
                        writer.write(encode_line({"kind": "limits_counted", "used": used}))
                await writer.drain()

    async def _take(self, reader: asyncio.StreamReader, worker: int) -> None:
        with contextlib.suppress(ConnectionError, EOFError):
            while True:
                request = await read_event(reader)
                try:
                    if request["kind"] == "hello":
                        self.pids[worker] = int(request["pid"])
                    elif request["kind"] == "counted":
                        add_counted(self._limiter, {s: int(t) for s, t in request["used"].items()})
                    elif request["kind"] == "in_flight":
                        self.loads.report(worker, request)
                    elif request["kind"] == "metrics":
                        self.metrics[worker] = list(request["samples"])
                        if (asked := self._asked.pop(worker, None)) is not None:
                            asked.set()
                    else:
                        self._on_request(request)
                except (KeyError, TypeError, ValueError) as error:
                    log.warning(
                        "a gateway worker sent a request that makes no sense (%s): %r", error, request
                    )


class WorkerFollowing:
    """A worker's side: follow its control plane over the local channel, keep the copy, send requests.

    :attr:`serves` is True while the control plane serves ``/v1`` itself and this
    worker holds a full copy: the worker then answers ``/v1``; otherwise it hands
    ``/v1`` to the control plane like everything else.
    """

    def __init__(
        self,
        state: GatewayState,
        limiter: Limiter,
        path: Path,
        models: Callable[[], Iterable[str]] = tuple,
        metrics: Callable[[], list[Any]] | None = None,
    ) -> None:
        self._metrics = metrics
        """This worker's gateway metric samples, sent every :data:`COUNT_S` (workermetrics.py)."""
        self._models = models
        """The models this worker routes to (its replica table's)."""
        self._state = state
        self._applier = StateApplier(state)
        self._limiter = limiter
        self._path = path
        self._pending: list[Event] = []
        self._usage = UsageSums()
        self._used: set[str] = set()
        self._more = asyncio.Event()
        self._serves = False
        self.connected = False
        self.connections = 0
        """Channels opened so far (each began with a full copy)."""

    @property
    def serves(self) -> bool:
        return self._serves and self._applier.holds_copy

    def request(self, request: Event) -> None:
        """Send ``request`` to the control plane (kept while the channel is down)."""
        if len(self._pending) >= PENDING_MAX:
            del self._pending[0]
            log.warning(
                "more than %d requests wait for the control plane: the oldest was dropped", PENDING_MAX
            )
        self._pending.append(request)
        self._more.set()

    def usage(self, record: UsageRecord) -> None:
        """Count a request's usage; the sums go with the next tick (at most :data:`TICK_S` later), kept
        while the channel is down. A line per request cost the control plane a fifth of its time reading
        them at thousands of requests a second, and waking the sender for each a tenth of the worker's."""
        self._usage.add(record)

    def used(self, model: str) -> None:
        """``model`` kept in use (every request's end says so): sent once per model with the next tick,
        kept while the channel is down. A line per request woke the sender for each and took the
        control plane a line to read."""
        self._used.add(model)

    async def run(self, backoff: Backoff | None = None) -> None:
        """Follow until cancelled, connecting again with backoff whenever the channel ends."""
        backoff = backoff or Backoff(base=0.05, cap=2.0)
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(str(self._path), limit=LINE_MAX)
            except OSError as error:
                delay = backoff.next_delay()
                log.info(
                    "cannot reach the control plane at %s (%s): again in %.2f s", self._path, error, delay
                )
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            self.connections += 1
            self._pending.insert(0, {"kind": "hello", "pid": os.getpid()})
            self._more.set()
            await self._follow(reader, writer)
            await asyncio.sleep(backoff.next_delay())

    async def _follow(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks = {asyncio.ensure_future(self._receive(reader)), asyncio.ensure_future(self._send(writer))}
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.connected = False
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
            writer.close()
        log.info("the local channel to the control plane ended: connecting again")

    async def _receive(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionError, EOFError):
            while True:
                event = await read_event(reader)
                kind = event["kind"]
                if kind == "serves":
                    self._serves = bool(event["serves"])
                    continue
                if kind == "send_metrics":
                    if self._metrics is not None:
                        self._pending.append({"kind": "metrics", "samples": self._metrics()})
                        self._more.set()
                    continue
                self._applier.apply(event)
                if kind == "live":
                    self.connected = True

    def in_flight(self) -> Event:
        """This worker's requests in flight, per model and per replica (those with any)."""
        feed = self._state.feed
        replicas = {r: n for r in self._state.replica_ids if (n := feed.replica_in_flight(r))}
        models = {m: n for m in self._models() if (n := feed.in_flight(m))}
        return {"kind": "in_flight", "models": models, "replicas": replicas}

    async def _send(self, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            loop = asyncio.get_running_loop()
            next_count = loop.time() + COUNT_S
            reported: Event | None = None
            while True:
                await wait_event(self._more, min(TICK_S, next_count - loop.time()))
                self._more.clear()
                if (load := self.in_flight()) != reported:
                    reported = load
                    self._pending.append(load)
                if loop.time() >= next_count:
                    next_count = loop.time() + COUNT_S
                    if used := self._limiter.unsaved():
                        self._pending.append({"kind": "counted", "used": used})
                    if self._metrics is not None:
                        self._pending.append({"kind": "metrics", "samples": self._metrics()})
                if self._usage:
                    self._pending.append({"kind": "usage_sums", "sums": self._usage.take()})
                if self._used:
                    in_use, self._used = self._used, set()
                    self._pending.extend({"kind": "used", "model": model} for model in sorted(in_use))
                if self._pending:  # one write for all
                    pending, self._pending = self._pending, []
                    writer.write(b"".join(encode_line(event) for event in pending))
                await writer.drain()
