"""Waiting in the gateway for a slot on a busy model: the event loop's side of :mod:`llmgw.core.flowqueue`.

With ``gateway.flow.mode: fair`` a request whose model has no free slot (every
ready replica serves as many requests as it has slots, counting the other
gateways' requests its engine reports) does not go to an engine's queue: it
waits here, in the model's :class:`~llmgw.core.flowqueue.FlowQueue`, and is
sent on the moment a slot frees (:meth:`FlowGate.slot_freed`, called when a
request on the model ends, a replica becomes ready, or an engine reports less
load). A turn given is a slot promised: until its request takes its lease,
newcomers queue behind it rather than take the slot.

Sheddable requests (priority 0) never take the last ``reserve_share`` of a
model's slots: headroom for every other request, so that an urgent one
rarely waits behind a batch's for a slot to free.

Several processes (a plane's gateway workers, other planes) queue apart,
each the requests it received. The process whose request ended learns of the
free slot first; left alone it would hand every slot it frees to its own
queue, and a flood arriving through one process would starve another's
requests until it drained. So each of a plane's workers is told how many
flows wait for the model in the plane's other workers (:meth:`FlowGate.elsewhere`,
from its plane every tick); while they wait it keeps at most its share of the
model's slots — the slots times its flows waiting over all the flows waiting,
at least one — and leaves a slot past its share free for the others, who see
it when the engine reports less load (within a second). Priorities order each
process's own queue; across workers only the flows' shares hold. Planes are
not told of each other's queues: between them the engines' reports alone
divide the slots.

A request waits at most ``queue_timeout_s`` (and its ``x-llmgw-deadline-ms``),
then 429 ``queue_timeout``; a full queue refuses with 429 ``queue_full``
(sheddable requests first). Both carry ``Retry-After``. A request whose
client leaves while it waits is taken out; one cancelled just after its turn
came passes the turn on.

Invariants: a waiting request's future is resolved at most once; the promised
count of a model equals its turns given and not yet taken; nothing here runs
while the model's queue is empty and a slot is free (:meth:`FlowGate.busy`
is the request path's only cost then).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from llmgw.core.flowqueue import LOWEST_PRIORITY, FlowQueue, FlowSettings, Waiting
from llmgw.gateway import metrics
from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.replicas import ReplicaTable

_SHED = "the queue was full and a request of a higher priority took this sheddable one's place"


@dataclass(frozen=True, slots=True)
class QueueState:
    """One model's queue as it is now: what ``ctl status``, the console and the portal show."""

    waiting: int = 0
    by_flow: dict[str, int] = field(default_factory=dict)
    """Requests waiting, by flow (project, user or key; empty text: no key)."""
    last_wait_s: float | None = None
    """How long the latest request sent on from it had waited (None: none was yet)."""


def summed(mine: Mapping[str, QueueState], others: Mapping[str, QueueState]) -> dict[str, QueueState]:
    """``mine`` with the queues other processes (a plane's workers) report added: who waits, per
    model and flow; the latest wait is this process's own, else the others'."""
    out = dict(mine)
    for model, theirs in others.items():
        held = out.get(model, QueueState())
        by_flow = dict(held.by_flow)
        for flow, count in theirs.by_flow.items():
            by_flow[flow] = by_flow.get(flow, 0) + count
        waited = held.last_wait_s if held.last_wait_s is not None else theirs.last_wait_s
        out[model] = QueueState(sum(by_flow.values()), by_flow, waited)
    return dict(sorted(out.items()))


class FlowGate:
    """Every model's queue of requests waiting for a slot, and the turns given as slots free."""

    def __init__(self, settings: FlowSettings, replicas: ReplicaTable) -> None:
        self.settings = settings
        self._replicas = replicas
        self._queues: dict[str, FlowQueue] = {}
        self._turns: dict[Waiting, asyncio.Future[None]] = {}
        self._promised: dict[str, int] = {}
        """Turns given and not yet taken, by model: slots held for requests on their way."""
        self.waited_s: dict[str, float] = {}
        """The latest wait of a request sent on, by model (what autoscaling and ``ctl status`` read)."""
        self._elsewhere: dict[str, int] = {}
        """Flows waiting for each model in other processes' queues, as last told."""
        replicas.on_slot_freed = self.slot_freed

    @property
    def enabled(self) -> bool:
        return self.settings.mode == "fair"

    def busy(self, model: str, sheddable: bool = False) -> bool:
        """Whether a request for ``model`` must wait its turn: others wait, or no slot is free (for a
        sheddable one: none past the reserve)."""
        if model in self._queues or model in self._promised:
            return True
        free = self._replicas.free_slots(model)
        return (free - self._reserve(model) if sheddable else free) <= 0

    def _reserve(self, model: str) -> int:
        share = self.settings.reserve_share
        return int(share * self._replicas.slots(model)) if share else 0  # one slot: none kept

    def depth(self) -> dict[str, int]:
        """Requests waiting, by model."""
        return {model: len(queue) for model, queue in self._queues.items()}

    def states(self) -> dict[str, QueueState]:
        """Each model that has queued: who waits now, and the latest wait."""
        models = set(self._queues) | set(self.waited_s)
        out = {}
        for model in sorted(models):
            queue = self._queues.get(model)
            by_flow = queue.by_flow() if queue is not None else {}
            out[model] = QueueState(sum(by_flow.values()), by_flow, self.waited_s.get(model))
        return out

    def _gauge(self, model: str, *flows: str) -> None:
        """The depth gauges of ``flows`` as ``model``'s queue holds them now (a flow gone: its series
        removed)."""
        queue = self._queues.get(model)
        held = queue.by_flow() if queue is not None else {}
        for flow in flows:
            if count := held.get(flow, 0):
                metrics.QUEUE_DEPTH.labels(model, flow).set(count)
            else:
                with contextlib.suppress(KeyError):  # it had no series yet
                    metrics.QUEUE_DEPTH.remove(model, flow)

    async def turn(self, model: str, flow: str, priority: int, deadline_ms: int | None = None) -> None:
        """Wait until a slot of ``model`` is this request's; ApiError 429 when the queue is full or
        the wait ran out."""
        loop = asyncio.get_running_loop()
        now = loop.time()  # the clock asyncio.timeout bounds the wait by
        wait_s = self.settings.queue_timeout_s
        if deadline_ms is not None:
            wait_s = min(wait_s, deadline_ms / 1000)
        queue = self._queues.get(model)
        if queue is None:
            queue = self._queues[model] = FlowQueue(self.settings.queue_max)
        sheddable = priority <= LOWEST_PRIORITY
        offer = queue.offer(flow, priority=priority, sheddable=sheddable, deadline=now + wait_s)
        if offer.shed is not None:
            shed = self._turns.pop(offer.shed, None)
            if shed is not None and not shed.done():
                metrics.QUEUE_REFUSED.labels(model, "queue_shed").inc()
                shed.set_exception(self._refusal(model, "queue_shed", _SHED))
            self._gauge(model, offer.shed.flow)
        if offer.waiting is None:
            self._forget_if_empty(model)
            metrics.QUEUE_REFUSED.labels(model, "queue_full").inc()
            raise self._refusal(model, "queue_full", offer.reason)
        waiting = offer.waiting
        future = self._turns[waiting] = loop.create_future()
        self._gauge(model, flow)
        self._replicas.count_waiting(model, 1)  # autoscaling reads it as demand (core/scaling.py)
        self.slot_freed(model)  # a slot may have freed between the check and now
        try:
            async with asyncio.timeout(wait_s):
                await future
        except TimeoutError:
            queue.remove(waiting)
            metrics.QUEUE_REFUSED.labels(model, "queue_timeout").inc()
            raise self._refusal(
                model, "queue_timeout", f"no slot of model '{model}' freed within {wait_s:g} s"
            ) from None
        except asyncio.CancelledError:
            queue.remove(waiting)
            if future.done() and not future.cancelled() and future.exception() is None:
                self._taken(model)  # the turn came as the client left: the next one has it
                self.slot_freed(model)
            raise
        finally:
            self._replicas.count_waiting(model, -1)
            self._turns.pop(waiting, None)
            self._gauge(model, flow)
            self._forget_if_empty(model)
        self._taken(model)
        waited = loop.time() - now
        self.waited_s[model] = waited
        metrics.QUEUE_WAIT.labels(model, flow).observe(waited)

    def elsewhere(self, flows: Mapping[str, int]) -> None:
        """How many flows wait for each model in the other processes' queues (none: a model left
        out); a model whose count changed may now have a slot for this process."""
        changed = {
            m for m in set(flows) | set(self._elsewhere) if flows.get(m, 0) != self._elsewhere.get(m, 0)
        }
        self._elsewhere = {m: n for m, n in flows.items() if n > 0}
        for model in changed:
            self.slot_freed(model)

    def share(self, model: str) -> int | None:
        """The most slots of ``model`` this process's requests may hold while other processes'
        requests wait for it (None: none wait elsewhere, every free slot is this one's)."""
        others = self._elsewhere.get(model, 0)
        queue = self._queues.get(model)
        if not others or queue is None:
            return None
        mine = len(queue.by_flow())
        return max(1, round(self._replicas.slots(model) * mine / (mine + others)))

    def slot_freed(self, model: str) -> None:
        """A slot of ``model`` may be free: give turns to the requests next in line, one per slot."""
        queue = self._queues.get(model)
        if not queue:
            return
        promised = self._promised.get(model, 0)
        free = self._replicas.free_slots(model) - promised
        if (share := self.share(model)) is not None:
            free = min(free, share - self._replicas.held_slots(model) - promised)
        reserve = self._reserve(model)
        while free > 0 and (waiting := queue.peek()) is not None:
            if waiting.sheddable and free <= reserve:
                return  # the rest are sheddable (the lowest priority): the reserve is not theirs
            queue.next()
            future = self._turns.get(waiting)
            if future is None or future.done():
                continue
            future.set_result(None)
            self._promised[model] = self._promised.get(model, 0) + 1
            free -= 1

    def _taken(self, model: str) -> None:
        left = self._promised.get(model, 0) - 1
        if left > 0:
            self._promised[model] = left
        else:
            self._promised.pop(model, None)

    def _forget_if_empty(self, model: str) -> None:
        queue = self._queues.get(model)
        if queue is not None and not queue:
            del self._queues[model]

    def _refusal(self, model: str, code: str, why: str) -> ApiError:
        retry = max(1, math.ceil(min(self.settings.queue_timeout_s, 60)))
        return ApiError(
            429,
            f"Model '{model}' is busy: {why}.",
            code,
            hint=f"retry in {retry} s, send fewer requests at once, or ask for more replicas of it",
            retry_after=retry,
        )
