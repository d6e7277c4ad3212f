"""The router's table of ready replicas, and the load this gateway puts on each.

The control plane calls :meth:`ReplicaTable.set_ready` when a replica becomes
ready and :meth:`ReplicaTable.remove` when it goes; requests call
:meth:`ReplicaTable.pick` and hold an :meth:`ReplicaTable.acquire` lease while
their replica serves them; a request that found none waits in
:meth:`ReplicaTable.changed` (``gateway/finding.py``). Everything here runs on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType

from llmgw.core.engines import DEFAULT_ENGINE
from llmgw.core.providers import Provider
from llmgw.core.routing import ReplicaLoad
from llmgw.core.scaling import ModelLoad, TtftWindow
from llmgw.gateway.routing import Router


@dataclass(frozen=True, slots=True)
class ReplicaEndpoint:
    """Where a ready replica answers and how to call it."""

    replica_id: str
    model: str
    """The catalog model the replica serves."""
    base_url: str
    """Scheme, host and port (no ``/v1``): requests go to ``base_url + "/v1/..."``."""
    api_key: str = field(repr=False)
    """The replica's own key, which its engine demands (a provider's key); never in a repr or a log."""
    capacity: int = 1
    """Requests the replica serves at once (the engine's parallel slots)."""
    engine: str = DEFAULT_ENGINE
    """The engine serving it: its load is read by that engine's metric names (gateway/loads.py)."""
    provider: Provider | None = None
    """Set for a model served outside the cluster (``gateway/providers.py``): no engine, no metrics
    read; ``capacity`` is its concurrency cap, over which requests wait as for a busy replica."""


class Lease:
    """One request in flight on a replica; :meth:`release` (or leaving the ``with``) ends it."""

    __slots__ = ("_load", "_released", "endpoint")

    def __init__(
        self, endpoint: ReplicaEndpoint, load: ReplicaLoad, released: Callable[[str], None] | None = None
    ) -> None:
        self.endpoint = endpoint
        self._load: ReplicaLoad | None = load
        self._released = released
        """Told the model when the lease ends (a capped replica: a waiting request may take the slot)."""
        load.in_flight += 1

    def release(self) -> None:
        """End the lease; calling it again does nothing."""
        load, self._load = self._load, None
        if load is not None:
            load.in_flight -= 1
            if self._released is not None:
                self._released(self.endpoint.model)

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class ReplicaTable:
    """Ready replicas by model, with this gateway's in-flight count per replica."""

    def __init__(self, router: Router | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.router = router if router is not None else Router()
        """Chooses among a model's replicas (policy, prefix tree, KV index)."""
        self._clock = clock
        self._endpoints: dict[str, ReplicaEndpoint] = {}
        self._loads: dict[str, ReplicaLoad] = {}
        self._by_model: dict[str, list[ReplicaLoad]] = {}
        self._waiters: dict[str, asyncio.Event] = {}
        self._draining: dict[str, ReplicaLoad] = {}
        """Replicas taken out of routing whose requests still finish there, with their load."""
        self._waiting: dict[str, int] = {}
        """Requests waiting for a ready replica, by model."""
        self._ttft = TtftWindow()
        self.on_slot_freed: Callable[[str], None] | None = None
        """Told a model's name when one of its slots may have freed (gateway/queueing.py)."""
        self._capped: set[str] = set()
        """Replicas whose capacity is a hard cap (providers): never picked while full."""

    # -- changes from the control plane --------------------------------------------------------

    def set_ready(self, endpoint: ReplicaEndpoint) -> None:
        """Add a ready replica, or update one; requests waiting for its model wake up."""
        old = self._endpoints.get(endpoint.replica_id)
        load = self._loads.get(endpoint.replica_id) or self._draining.pop(endpoint.replica_id, None)
        if load is None:
            load = self._loads[endpoint.replica_id] = ReplicaLoad(endpoint.replica_id)
        load.capacity = max(1, endpoint.capacity)
        if old is not None and old.model != endpoint.model:
            self._unlist(old.model, load)
        members = self._by_model.setdefault(endpoint.model, [])
        if load not in members:
            members.append(load)
        self._endpoints[endpoint.replica_id] = endpoint
        if endpoint.provider is not None:
            self._capped.add(endpoint.replica_id)
        else:
            self._capped.discard(endpoint.replica_id)
        self._wake(endpoint.model)

    def _wake(self, model: str) -> None:
        """Requests waiting for a replica of ``model`` look again (:meth:`changed`)."""
        waiter = self._waiters.pop(model, None)
        if waiter is not None:
            waiter.set()
        if self.on_slot_freed is not None:
            self.on_slot_freed(model)

    def count_waiting(self, model: str, change: int) -> None:
        """Requests of ``model`` waiting elsewhere (its flow queue) start or stop counting as waiting."""
        left = self._waiting.get(model, 0) + change
        if left > 0:
            self._waiting[model] = left
        else:
            self._waiting.pop(model, None)

    def slots(self, model: str) -> int:
        """Slots of ``model``'s routable replicas: requests they serve at once."""
        return sum(load.capacity for load in self._by_model.get(model, ()) if load.readable)

    def held_slots(self, model: str) -> int:
        """Slots of ``model``'s routable replicas this gateway's own requests hold."""
        return sum(load.in_flight for load in self._by_model.get(model, ()) if load.readable)

    def free_slots(self, model: str) -> int:
        """Slots of ``model``'s routable replicas no request holds (this gateway's, or others' its
        engines report)."""
        return sum(
            max(0, load.capacity - load.in_flight - load.others)
            for load in self._by_model.get(model, ())
            if load.readable
        )

    def remove(self, replica_id: str) -> ReplicaEndpoint | None:
        """Take a replica out of routing; requests already on it finish there."""
        self._draining.pop(replica_id, None)
        self._capped.discard(replica_id)
        endpoint = self._endpoints.pop(replica_id, None)
        load = self._loads.pop(replica_id, None)
        if endpoint is not None and load is not None:
            self._unlist(endpoint.model, load)
        self.router.forget(replica_id)
        return endpoint

    def drain(self, replica_id: str) -> None:
        """Send the replica no new request; :meth:`in_flight` keeps counting the ones on it."""
        load = self._loads.get(replica_id)
        self.remove(replica_id)
        if load is not None:
            self._draining[replica_id] = load

    def replace(self, endpoints: Iterable[ReplicaEndpoint]) -> None:
        """Make ``endpoints`` the whole set of ready replicas (after a resync), keeping known loads."""
        wanted = {e.replica_id: e for e in endpoints}
        for replica_id in [r for r in self._endpoints if r not in wanted]:
            self.remove(replica_id)
        for endpoint in wanted.values():
            self.set_ready(endpoint)

    def _unlist(self, model: str, load: ReplicaLoad) -> None:
        members = self._by_model.get(model)
        if members is None:
            return
        if load in members:
            members.remove(load)
        if not members:
            del self._by_model[model]

    # -- questions from requests ---------------------------------------------------------------

    def ready(self, model: str) -> list[ReplicaEndpoint]:
        """The ready replicas of ``model``."""
        return [self._endpoints[load.replica_id] for load in self._by_model.get(model, ())]

    def loads(self, model: str) -> list[ReplicaLoad]:
        """The load of each ready replica of ``model`` (live objects: read, do not change)."""
        return list(self._by_model.get(model, ()))

    def models(self) -> set[str]:
        """Models with at least one ready replica."""
        return set(self._by_model)

    def get(self, replica_id: str) -> ReplicaEndpoint | None:
        return self._endpoints.get(replica_id)

    def in_flight(self, replica_id: str) -> int:
        """Requests this gateway has on the replica now (ready or draining)."""
        load = self._loads.get(replica_id) or self._draining.get(replica_id)
        return 0 if load is None else load.in_flight

    def model_load(self, model: str) -> ModelLoad:
        """The model's load as autoscaling reads it (:mod:`llmgw.core.scaling`)."""
        loads = self._by_model.get(model, ())
        slots = sum(load.capacity for load in loads)
        total = sum(load.in_flight + load.others for load in loads)
        return ModelLoad(
            ready=len(loads),
            slots=slots,
            running=min(total, slots),
            waiting=max(0, total - slots) + self._waiting.get(model, 0),
            ttft_ms=self._ttft.mean(model, self._clock()),
        )

    def saw_ttft(self, model: str, ttft_s: float) -> None:
        """A streamed answer of ``model`` took ``ttft_s`` to its first token."""
        self._ttft.add(model, self._clock(), ttft_s * 1000)

    def pick(
        self,
        model: str,
        exclude: Collection[str] = (),
        prompt: str = "",
        tokens: Sequence[int] | None = None,
        salt: str = "",
    ) -> ReplicaEndpoint | None:
        """The ready replica of ``model`` the router chooses for ``prompt`` (:mod:`llmgw.gateway.routing`).

        Without a prompt (or under the least-loaded policy): the lowest share of
        its capacity in use, ties rotating. ``tokens``: the prompt's tokens, for
        KV-block overlap; ``salt``: its cache salt, if any. ``exclude`` names
        replicas this request already failed on.
        """
        loads = self._by_model.get(model)
        if not loads:
            return None
        if exclude:
            loads = [load for load in loads if load.replica_id not in exclude]
            if not loads:
                return None
        if self._capped:
            loads = [load for load in loads if not self.full(load)]
            if not loads:
                return None
        if len(loads) == 1:
            return self._endpoints[loads[0].replica_id] if loads[0].readable else None
        chosen = self.router.choose(model, loads, prompt, tokens, salt)
        return None if chosen is None else self._endpoints[chosen.replica_id]

    def full(self, load: ReplicaLoad) -> bool:
        """Whether a capped replica (a provider) has its cap of requests in flight."""
        return load.replica_id in self._capped and load.in_flight >= load.capacity

    def endpoints(self) -> list[ReplicaEndpoint]:
        """Every ready replica."""
        return list(self._endpoints.values())

    def set_engine_load(self, replica_id: str, running_and_waiting: int | None) -> None:
        """What the replica's engine reported (None: its metrics could not be read; route around it).

        Only the requests beyond this router's own in flight are kept (``others``): this
        router's count is exact and current, the engine's is a second old.
        """
        load = self._loads.get(replica_id)
        if load is None:
            return
        readable = running_and_waiting is not None
        others = max(0, (running_and_waiting or 0) - load.in_flight)
        fewer, load.others = others < load.others, others
        if fewer and self.on_slot_freed is not None:
            self.on_slot_freed(self._endpoints[replica_id].model)
        if readable and not load.readable:  # routable again: requests waiting for its model look again
            load.readable = True
            self._wake(self._endpoints[replica_id].model)
        else:
            load.readable = readable

    def acquire(self, endpoint: ReplicaEndpoint) -> Lease:
        """Count a request in flight on ``endpoint`` until the lease is released."""
        load = self._loads.get(endpoint.replica_id)
        if load is None:
            # Removed meanwhile: count on a detached load so release stays balanced.
            load = ReplicaLoad(endpoint.replica_id, capacity=max(1, endpoint.capacity))
        released = self._wake if endpoint.replica_id in self._capped else self.on_slot_freed
        return Lease(endpoint, load, released)

    async def changed(self, model: str, timeout_s: float) -> bool:
        """Wait until a replica of ``model`` becomes ready or routable again (its load read after
        it could not be); False when ``timeout_s`` passed first. The request counts as waiting."""
        if timeout_s <= 0:
            return False
        waiter = self._waiters.get(model)
        if waiter is None:
            waiter = self._waiters[model] = asyncio.Event()
        self._waiting[model] = self._waiting.get(model, 0) + 1
        try:
            async with asyncio.timeout(timeout_s):
                await waiter.wait()
        except TimeoutError:
            return False
        finally:
            self._waiting[model] -= 1
            if not self._waiting[model]:
                del self._waiting[model]
        return True

    async def wait_ready(self, model: str, timeout_s: float) -> bool:
        """Wait until ``model`` has a ready replica; False when ``timeout_s`` passed first."""
        return await self.wait_until(model, lambda: bool(self._by_model.get(model)), timeout_s)

    async def wait_until(self, model: str, satisfied: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until ``satisfied()`` holds, asked again each time a replica of ``model`` becomes
        ready; False when ``timeout_s`` passed first. The request counts as waiting for ``model``."""
        if satisfied():
            return True
        self._waiting[model] = self._waiting.get(model, 0) + 1
        try:
            return await self._wait_until(model, satisfied, timeout_s)
        finally:
            self._waiting[model] -= 1
            if not self._waiting[model]:
                del self._waiting[model]

    async def _wait_until(self, model: str, satisfied: Callable[[], bool], timeout_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            waiter = self._waiters.get(model)
            if waiter is None:
                waiter = self._waiters[model] = asyncio.Event()
            try:
                async with asyncio.timeout(remaining):
                    await waiter.wait()
            except TimeoutError:
                return satisfied()
            if satisfied():
                return True

    def __len__(self) -> int:
        return len(self._endpoints)
