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
import math

from llmgw.core.flowqueue import LOWEST_PRIORITY, FlowQueue, FlowSettings, Waiting
from llmgw.gateway import metrics
from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.replicas import ReplicaTable

_SHED = "the queue was full and a request of a higher priority took this sheddable one's place"


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
        if offer.waiting is None:
            self._forget_if_empty(model)
            metrics.QUEUE_REFUSED.labels(model, "queue_full").inc()
            raise self._refusal(model, "queue_full", offer.reason)
        waiting = offer.waiting
        future = self._turns[waiting] = loop.create_future()
        metrics.QUEUE_DEPTH.labels(model).set(len(queue))
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
            metrics.QUEUE_DEPTH.labels(model).set(len(queue))
            self._forget_if_empty(model)
        self._taken(model)
        waited = loop.time() - now
        self.waited_s[model] = waited
        metrics.QUEUE_WAIT.labels(model).observe(waited)

    def slot_freed(self, model: str) -> None:
        """A slot of ``model`` may be free: give turns to the requests next in line, one per slot."""
        queue = self._queues.get(model)
        if not queue:
            return
        free = self._replicas.free_slots(model) - self._promised.get(model, 0)
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
