"""The local channel between a control plane and its gateway workers: a Unix socket in the data dir (0600).

It carries the state protocol of the stream to standbys: its server and
follower (:mod:`llmgw.controlplane.statesharing.stateprotocol`) over a
:class:`~llmgw.protocol.unix_transport.UnixChannel` (one frame a line), and
these parts of it:

- the control plane (:class:`WorkerChannelServer`) sends each worker that
  connects a full copy of its :class:`~llmgw.controlplane.statesharing.gatewaystate.GatewayState`
  (ending with ``Live``), then every change; every :data:`TICK_S` it also
  sends ``Serves`` when it changed (whether this plane serves ``/v1`` itself:
  it leads, or holds a leader's copy) and, every :data:`COUNT_S`, the day and
  month counts of every limited subject as its own limiter holds them
  (``LimitsCounted``: the store's counts plus what every worker reported);
- a worker (:class:`WorkerFollowing`) says its pid first (``Hello``: a
  restarted control plane knows its own workers serve), then sends back the
  standby stream's requests (``Wanted``, ``ReplicaFailed`` at once; ``Used``
  once per model every :data:`TICK_S`) and its usage, summed per key, model
  and place and sent every :data:`TICK_S` (``UsageSummed``: a line per tick,
  not per request, which the control plane adds to its usage writer or sends
  on to the leader) and, every
  :data:`COUNT_S`, the tokens it counted against limits since the last report
  (``Counted``), which the control plane adds to its own meters, so that its
  limit writer stores them and every worker sees them; the samples of its
  gateway metrics (``Metrics``, every :data:`COUNT_S` and whenever the
  control plane asks, ``SendMetrics``, as a scrape of its ``/metrics`` does:
  :mod:`llmgw.controlplane.metrics.workermetrics`); and its requests in flight per
  model and replica (``InFlight``, when they change, looked at every
  :data:`TICK_S`: :class:`WorkerLoads`).

A worker whose channel ends keeps its copy and serves from it, keeps its
requests (at most :data:`PENDING_MAX`) and connects again with backoff; the
control plane then sends a new full copy. Only the owner of the data dir can
connect: the socket is bound under a temporary name, made 0600, then renamed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from llmgw.controlplane.statesharing.gatewaystate import GatewayState
from llmgw.controlplane.statesharing.stateevents import (
    Counted,
    Hello,
    InFlight,
    LimitsCounted,
    Metrics,
    QueuedElsewhere,
    Request,
    SendMetrics,
    ServerEvent,
    Serves,
)
from llmgw.controlplane.statesharing.stateprotocol import (
    PENDING_MAX,
    TICK_S,
    Follower,
    StateFollower,
    StateServer,
)
from llmgw.core.backoff import Backoff
from llmgw.gateway.limiting import Limiter
from llmgw.gateway.queueing import QueueState
from llmgw.gateway.usage import UsageRecord
from llmgw.protocol.channels import StateChannel
from llmgw.protocol.unix_transport import (
    LINE_MAX,
    UnixServer,
    connect_unix,
    identity,
    private_unix_socket,
)

__all__ = [
    "COUNT_S",
    "LINE_MAX",
    "PENDING_MAX",
    "SOCKET_NAME",
    "TICK_S",
    "WorkerChannelServer",
    "WorkerFollowing",
    "WorkerLoads",
    "private_unix_socket",
]

log = logging.getLogger(__name__)

SOCKET_NAME = "workers.sock"
"""The channel's socket, in the control plane's data dir."""
COUNT_S = 1.0
"""How often limit counts go each way."""
METRICS_WAIT_S = 1.0
"""Longest a scrape of ``/metrics`` waits for the workers' fresh samples."""

OnRequest = Callable[[Request], None]


def limit_totals(limiter: Limiter) -> dict[str, tuple[int, int]]:
    """Each limited subject's day and month counts (tokens, and money) as ``limiter`` holds them."""
    return limiter.totals()


def add_counted(limiter: Limiter, used: dict[str, int]) -> None:
    """What a worker counted: into this limiter's meters as if counted here (written, then sent on)."""
    limiter.add_counted(used)


class WorkerLoads:
    """The requests each connected worker has in flight, per model and per replica, as last reported
    (every :data:`TICK_S` when they change): what the reconciler adds to this plane's own before it
    lets an on-demand model idle or a draining replica stop."""

    def __init__(self) -> None:
        self._reports: dict[int, InFlight] = {}

    def report(self, worker: int, report: InFlight) -> None:
        self._reports[worker] = report

    def forget(self, worker: int) -> None:
        self._reports.pop(worker, None)

    def in_flight(self, model: str) -> int:
        return sum(r.models.get(model, 0) for r in self._reports.values())

    def replica_in_flight(self, replica_id: str) -> int:
        return sum(r.replicas.get(replica_id, 0) for r in self._reports.values())

    def waiting(self, model: str) -> int:
        """Requests of ``model`` waiting in the workers' flow queues: demand autoscaling reads."""
        return sum(sum(r.queued.get(model, {}).values()) for r in self._reports.values())

    def flows_elsewhere(self, worker: int) -> dict[str, int] | None:
        """Flows waiting per model in the other workers' queues, for a worker that reports a queue
        of its own (None for one that reports none: it has no use for them, and a worker of the
        release before flow queues would not read them)."""
        own = self._reports.get(worker)
        if own is None or not own.queued:
            return None
        out: dict[str, int] = {}
        for other, report in self._reports.items():
            if other == worker:
                continue
            for model, flows in report.queued.items():
                out[model] = out.get(model, 0) + len(flows)
        return out

    def queues(self) -> dict[str, QueueState]:
        """The workers' flow queues per model: who waits, summed per flow, and the longest of their
        latest waits."""
        waiting: dict[str, dict[str, int]] = {}
        waited: dict[str, float] = {}
        for report in self._reports.values():
            for model, flows in report.queued.items():
                into = waiting.setdefault(model, {})
                for flow, count in flows.items():
                    into[flow] = into.get(flow, 0) + count
            for model, seconds in report.waited_s.items():
                waited[model] = max(seconds, waited.get(model, 0.0))
        return {
            model: QueueState(sum(by.values()), by, waited.get(model))
            for model in sorted(set(waiting) | set(waited))
            for by in (waiting.get(model, {}),)
        }


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
        self._limiter = limiter
        self._on_request = on_request
        self._serves = serves
        self._server = StateServer(state, self, tick_s=TICK_S)
        self.metrics: dict[int, list[Any]] = {}
        """Each connected worker's last gateway metric samples."""
        self._asked: dict[int, asyncio.Event] = {}
        self.pids: dict[int, int] = {}
        """Each connected worker's pid (it says it first: ``Hello``)."""
        self._told_serves: dict[int, bool] = {}
        self._told_elsewhere: dict[int, dict[str, int]] = {}
        self._next_count: dict[int, float] = {}

    @property
    def connected(self) -> int:
        """Workers connected now."""
        return len(self._server.followers)

    async def run(self, path: Path) -> None:
        listening: UnixServer[bytes, bytes] = UnixServer(self._connection, identity, identity)
        await listening.start(private_unix_socket(path))
        try:
            await asyncio.Future()  # serve until cancelled
        finally:
            await listening.close()  # each worker's channel ends: it connects again
            path.unlink(missing_ok=True)  # noqa: ASYNC240  # one unlink, on the way out

    async def _connection(self, channel: StateChannel) -> None:
        await self._server.serve(channel, channel.peer)

    async def fresh_metrics(self, timeout_s: float = METRICS_WAIT_S) -> list[list[Any]]:
        """Every connected worker's gateway samples as of now (a scrape counts every request answered
        before it): each is asked, and answers within ``timeout_s`` or its last samples are used."""
        waits = []
        for follower in list(self._server.followers):
            asked = self._asked.setdefault(id(follower), asyncio.Event())
            waits.append(asked.wait())
            await self._server.tell(follower, SendMetrics())
        if waits:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), timeout_s)
        return list(self.metrics.values())

    # the server's part (stateprotocol.ServerPart)

    def joined(self, follower: Follower) -> None:
        self._next_count[id(follower)] = asyncio.get_running_loop().time() + COUNT_S

    def left(self, follower: Follower) -> None:
        worker = id(follower)
        self.loads.forget(worker)
        self.metrics.pop(worker, None)
        self.pids.pop(worker, None)
        self._told_serves.pop(worker, None)
        self._told_elsewhere.pop(worker, None)
        self._next_count.pop(worker, None)
        if (asked := self._asked.pop(worker, None)) is not None:
            asked.set()

    def take(self, follower: Follower, request: Request) -> None:
        worker = id(follower)
        match request:
            case Hello(pid):
                self.pids[worker] = pid
            case Counted(tokens):
                add_counted(self._limiter, dict(tokens))
            case InFlight():
                self.loads.report(worker, request)
            case Metrics(samples):
                self.metrics[worker] = list(samples)
                if (asked := self._asked.pop(worker, None)) is not None:
                    asked.set()
            case _:
                self._on_request(request)

    def tick(self, follower: Follower) -> Sequence[ServerEvent]:
        worker = id(follower)
        events: list[ServerEvent] = []
        if (serves := self._serves()) != self._told_serves.get(worker):
            self._told_serves[worker] = serves
            events.append(Serves(serves))
        elsewhere = self.loads.flows_elsewhere(worker)
        if elsewhere is not None and elsewhere != self._told_elsewhere.get(worker):
            self._told_elsewhere[worker] = elsewhere
            events.append(QueuedElsewhere(elsewhere))
        now = asyncio.get_running_loop().time()
        if now >= self._next_count.get(worker, now):
            self._next_count[worker] = now + COUNT_S
            if totals := limit_totals(self._limiter):
                events.append(LimitsCounted(totals))
        return events

    def going(self) -> bool:
        return True


class WorkerFollowing:
    """A worker's side: follow its control plane over the local channel, keep the copy, send requests.

    :attr:`serves` is True while the control plane serves ``/v1`` itself and this
    worker holds a full copy: the worker then answers ``/v1``; otherwise it hands
    ``/v1`` to the control plane like everything else. When the channel ends
    the worker keeps its copy and what it was last told (it serves on while its
    plane is away, as across the plane's own restart) and connects again.
    """

    def __init__(
        self,
        state: GatewayState,
        limiter: Limiter,
        path: Path,
        models: Callable[[], Iterable[str]] = tuple,
        metrics: Callable[[], list[Any]] | None = None,
        queued: Callable[[], Mapping[str, QueueState]] = dict,
        elsewhere: Callable[[Mapping[str, int]], None] | None = None,
    ) -> None:
        self._elsewhere = elsewhere
        """Told how many flows wait per model in the other workers' queues (``FlowGate.elsewhere``)."""
        self._metrics = metrics
        self._queued = queued
        """This worker's flow queues, by model (``ReplicaFinder.queues``)."""
        """This worker's gateway metric samples, sent every :data:`COUNT_S` (workermetrics.py)."""
        self._models = models
        """The models this worker routes to (its replica table's)."""
        self._state = state
        self._limiter = limiter
        self._path = path
        self._follower = StateFollower(state, self, what=f"the control plane at {path}")
        self._serves = False
        self._reported: InFlight | None = None
        self._next_count = 0.0

    @property
    def serves(self) -> bool:
        return self._serves and self._follower.holds_copy

    @property
    def connected(self) -> bool:
        return self._follower.connected

    @property
    def connections(self) -> int:
        """Channels opened so far (each began with a full copy)."""
        return self._follower.connections

    def request(self, request: Request) -> None:
        """Send ``request`` to the control plane (kept while the channel is down)."""
        self._follower.request(request)

    def usage(self, record: UsageRecord) -> None:
        """Count a request's usage; the sums go with the next tick (at most :data:`TICK_S` later), kept
        while the channel is down."""
        self._follower.usage(record)

    def used(self, model: str) -> None:
        """``model`` kept in use: sent once per model with the next tick, kept while the channel is down."""
        self._follower.used(model)

    async def run(self, backoff: Backoff | None = None) -> None:
        """Follow until cancelled, connecting again with backoff whenever the channel ends."""
        await self._follower.run(
            lambda: connect_unix(self._path, identity, identity),
            backoff or Backoff(base=0.05, cap=2.0),
            first=self._hello,
        )

    def _hello(self) -> Sequence[Request]:
        """What a new channel begins with: who this worker is; its loads and counts are reported anew."""
        self._reported = None
        self._next_count = asyncio.get_running_loop().time() + COUNT_S
        return (Hello(os.getpid()),)

    def in_flight(self) -> InFlight:
        """This worker's requests in flight, per model and per replica (those with any)."""
        feed = self._state.feed
        replicas = {r: n for r in self._state.replica_ids if (n := feed.replica_in_flight(r))}
        models = {m: n for m in self._models() if (n := feed.in_flight(m))}
        queues = self._queued()
        queued = {m: dict(q.by_flow) for m, q in queues.items() if q.by_flow}
        waited = {m: q.last_wait_s for m, q in queues.items() if q.last_wait_s is not None}
        return InFlight(models, replicas, queued, waited)

    # the follower's part (stateprotocol.FollowerPart)

    def told(self, event: ServerEvent) -> None:
        match event:
            case Serves(serves):
                self._serves = serves
            case SendMetrics():
                if self._metrics is not None:
                    self._follower.request(Metrics(tuple(self._metrics())))
            case QueuedElsewhere(flows):
                if self._elsewhere is not None:
                    self._elsewhere(flows)
            case _:
                log.warning("the control plane sent %s, which a worker does not take", event.kind)

    def tick(self) -> Iterable[Request]:
        if (load := self.in_flight()) != self._reported:
            self._reported = load
            yield load
        now = asyncio.get_running_loop().time()
        if now >= self._next_count:
            self._next_count = now + COUNT_S
            if used := self._limiter.unsaved():
                yield Counted(used)
            if self._metrics is not None:
                yield Metrics(tuple(self._metrics()))
