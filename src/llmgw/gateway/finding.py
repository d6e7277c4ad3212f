"""Finding a replica for a request, or waiting for one: one policy for chat, adapters and jobs.

A request first picks among the ready replicas itself (the router's choice,
no await: the chat path's common case). Only when that found none does it
come here, to :meth:`ReplicaFinder.find`, which tries again as the replicas
change, bounded by ``request_wait_s``:

- nothing ready could serve the request (no ready replica of the model; for
  an adapter given at start, none holding it): the control plane is told the
  model wants a replica (:meth:`~llmgw.gateway.outbound.GatewayOutbound.replica_wanted`),
  once per request, and the request waits;
- a ready replica could, but the router declines it now (its engine's load
  could not be read: the router never sends blind): nothing is asked for (the
  replica exists) and the request waits;
- the wait ends when a replica of the model becomes ready or routable again
  (:meth:`~llmgw.gateway.replicas.ReplicaTable.changed`) and the pick then
  finds one, or when ``request_wait_s`` ran out: 503 ``model_not_ready``
  (:meth:`ReplicaFinder.not_ready`), with ``Retry-After``.

A waiting request counts as waiting for its model (autoscaling reads it).

A replica found, the request may still have to wait its turn for a slot
(``gateway.flow.mode: fair``, :mod:`llmgw.gateway.queueing`): :meth:`ReplicaFinder.take_turn`
reads its priority (``x-llmgw-priority``, 0 to 9, never above its key's: the
``priority`` of its key's limits and their owners', :meth:`~llmgw.gateway.limiting.Limiter.priority`,
5 when none sets one) and deadline (``x-llmgw-deadline-ms``) and queues it under its flow (its key's
project, or the key).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from llmgw.core.flowqueue import HIGHEST_PRIORITY, LOWEST_PRIORITY
from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.catalog_view import GatewayCatalog
from llmgw.gateway.exchange import Exchange
from llmgw.gateway.limiting import Limiter
from llmgw.gateway.outbound import Telling
from llmgw.gateway.queueing import FlowGate, QueueState
from llmgw.gateway.replicas import ReplicaTable
from llmgw.gateway.settings import GatewaySettings

T = TypeVar("T")


class ReplicaFinder:
    """The bounded wait of a request whose own pick found no replica."""

    __slots__ = ("_catalog", "_limiter", "_replicas", "_settings", "_telling", "flow")

    def __init__(
        self,
        settings: GatewaySettings,
        replicas: ReplicaTable,
        catalog: GatewayCatalog,
        telling: Telling,
        limiter: Limiter | None = None,
    ) -> None:
        self._settings = settings
        self._replicas = replicas
        self._catalog = catalog
        self._telling = telling
        self._limiter = limiter if limiter is not None else Limiter()
        self.flow = FlowGate(settings.flow, replicas) if settings.flow.mode == "fair" else None
        """Where requests wait their turn for a slot of a busy model (None: they go at once)."""

    async def find(
        self, model: str, pick: Callable[[], Awaitable[T | None]], servable: Callable[[], bool] | None = None
    ) -> T | None:
        """What ``pick()`` finds among ``model``'s replicas, waiting up to ``request_wait_s``; None
        when it found nothing in time.

        ``servable()``: whether a ready replica could serve the request (default: ``model`` has
        one); while it is false the model is asked for a replica, once.
        """
        replicas = self._replicas
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.request_wait_s
        asked = False
        while (found := await pick()) is None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            could = servable() if servable is not None else bool(replicas.ready(model))
            if not could and not asked:
                self._telling.replica_wanted(model)
                asked = True
            await replicas.changed(model, remaining)
        return found

    def elsewhere(self, flows: Mapping[str, int]) -> None:
        """How many flows wait per model in other processes' queues (:meth:`FlowGate.elsewhere`)."""
        if self.flow is not None:
            self.flow.elsewhere(flows)

    def queues(self) -> dict[str, QueueState]:
        """Each model's flow queue now (empty without ``gateway.flow.mode: fair``)."""
        return {} if self.flow is None else self.flow.states()

    async def take_turn(self, exchange: Exchange) -> bool:
        """Wait for a slot of ``exchange.model`` in its queue when its slots are taken (call only
        with :attr:`flow` set); whether it waited."""
        gate = self.flow
        assert gate is not None
        key = exchange.key
        priority = most = self._limiter.priority(key)
        deadline_ms = None
        for name, value in exchange.headers:
            if name == b"x-llmgw-priority":
                priority = min(_header_int(name, value, HIGHEST_PRIORITY), most)
            elif name == b"x-llmgw-deadline-ms":
                deadline_ms = _header_int(name, value, 86_400_000)
        if not gate.busy(exchange.model, sheddable=priority <= LOWEST_PRIORITY):
            return False
        by_key = gate.settings.fair_by == "key"
        flow = "" if key is None else key.key_id if by_key else key.project
        await gate.turn(exchange.model, flow, priority, deadline_ms)
        return True

    def not_ready(self, model: str, adapter: str = "") -> ApiError:
        """503 for a request that found no ready replica of ``model`` (holding ``adapter``, if named)."""
        wait = self._settings.retry_after_s
        entry = self._catalog.get(model)
        if adapter and self._replicas.ready(model):
            why = (
                f"No ready replica of model '{model}' holds adapter '{adapter}' yet: its engine loads "
                "adapters only at start, and replicas with it are being started."
            )
        elif full := [load for load in self._replicas.loads(model) if self._replicas.full(load)]:
            return ApiError(
                503,
                f"Model '{model}' has its provider's cap of {full[0].capacity} requests in flight and no "
                f"slot freed within {self._settings.request_wait_s:g} s. Retry in {wait} s, or raise the "
                "model's provider.max_concurrency.",
                "model_busy",
                retry_after=wait,
            )
        elif self._replicas.ready(model):
            why = (
                f"The ready replicas of model '{model}' cannot take requests now (their engines' load "
                "could not be read)."
            )
        elif entry is not None and entry.on_demand:
            why = f"Model '{model}' is being started on demand and is not ready yet."
        else:
            why = f"No replica of model '{model}' is ready."
        return ApiError(
            503,
            f"{why} Retry in {wait} s; `llmgw status` shows the model's replicas.",
            "model_not_ready",
            retry_after=wait,
        )


def _header_int(name: bytes, value: bytes, most: int) -> int:
    text = value.decode("latin-1").strip()
    if not text.isdigit() or int(text) > most:
        header = name.decode("latin-1")
        raise ApiError(
            400,
            f"Header {header} must be a whole number from 0 to {most}, not {text!r}.",
            "invalid_header",
            header,
        )
    return int(text)
