"""The one way in: what the control plane tells the gateway, and the little it asks back.

The gateway serves from memory that the control plane keeps current; every
change comes through :class:`GatewayFeed` (``gateway.feed``), so nothing
outside ``llmgw.gateway`` reaches into the replica table, the router's KV
index, the adapters or the key ring:

- a replica ready (with the adapter files its node holds) or gone;
- the catalog replaced (models and their adapters; a provider model's entry in the replica table);
- the API keys replaced;
- a replica's KV-block changes (:class:`~llmgw.core.kvblocks.KvBlocksUpdate`);
- the limits replaced, the planes' shares of them, and the counts of budgets read back from the store;
- the models' prices replaced (what requests cost, counted against money budgets and in usage);
- a replica draining (no new requests; the ones on it finish);
- serving stopped or started (``llmgw stop`` / ``llmgw start``).

Every method runs on the event loop and returns at once. Whoever must see
the same changes (a control plane streaming them to its standbys:
``controlplane/statesharing/gatewaystate.py``) listens with :meth:`GatewayFeed.listen`:
each change is told to every listener, by the method's name and arguments,
after the gateway applied it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from llmgw.core.catalog import ModelDefinition
from llmgw.core.kvblocks import KvBlocksUpdate
from llmgw.core.limits import Limits
from llmgw.core.limitshares import PlaneShares
from llmgw.core.pricing import Prices
from llmgw.core.scaling import ModelLoad
from llmgw.gateway.adapters import Adapters, adapter_entries
from llmgw.gateway.catalog_view import GatewayCatalog, catalog_entries
from llmgw.gateway.keys import KeyEntry, KeyRing
from llmgw.gateway.limiting import Limiter
from llmgw.gateway.providers import place_providers
from llmgw.gateway.replicas import ReplicaEndpoint, ReplicaTable

FeedListener = Callable[[str, tuple[Any, ...]], None]
"""Told each change after it is applied: the change's method name and its arguments (iterables as lists)."""


class GatewayFeed:
    """Changes to the gateway's keys, catalog, replicas, KV index and stopped flag."""

    def __init__(
        self,
        keys: KeyRing,
        catalog: GatewayCatalog,
        replicas: ReplicaTable,
        adapters: Adapters,
        limiter: Limiter | None = None,
    ) -> None:
        self._keys = keys
        self._limiter = limiter if limiter is not None else Limiter()
        self._catalog = catalog
        self._replicas = replicas
        self._adapters = adapters
        self.stopped = False
        """When True (``llmgw stop``) every POST under ``/v1`` answers 503 ``system_stopped``."""
        self._listeners: list[FeedListener] = []

    def listen(self, listener: FeedListener) -> None:
        """Tell ``listener`` every change from now on (it must return at once, as the changes do)."""
        self._listeners.append(listener)

    def _told(self, change: str, *args: Any) -> None:
        for listener in self._listeners:
            listener(change, args)

    # -- changes -----------------------------------------------------------------------------------

    def replica_ready(
        self, endpoint: ReplicaEndpoint, adapter_paths: Mapping[str, str] | None = None
    ) -> None:
        """``endpoint`` serves (or serves again); ``adapter_paths``: adapter name -> file on its node."""
        self._adapters.set_paths(endpoint.replica_id, dict(adapter_paths or {}))
        self._replicas.set_ready(endpoint)
        self._told("replica_ready", endpoint, dict(adapter_paths or {}))

    def replica_gone(self, replica_id: str) -> None:
        """The replica left: no new request goes to it; requests on it finish there."""
        self._replicas.remove(replica_id)
        self._adapters.forget(replica_id)
        self._told("replica_gone", replica_id)

    def replica_draining(self, replica_id: str) -> None:
        """Scaled down or evicted: no new request goes to it; :meth:`replica_in_flight` counts the rest."""
        self._replicas.drain(replica_id)
        self._adapters.forget(replica_id)
        self._told("replica_draining", replica_id)

    def catalog_replaced(self, models: Iterable[ModelDefinition]) -> None:
        """The catalog as it is now: ``/v1/models`` and the adapters requests may name."""
        models = list(models)
        self._catalog.replace(catalog_entries(models))
        self._adapters.replace(adapter_entries(models))
        place_providers(self._replicas, models)
        self._told("catalog_replaced", models)

    def keys_replaced(self, keys: Iterable[KeyEntry]) -> None:
        """The API keys that are valid now (every other key is refused from the next request)."""
        keys = list(keys)
        self._keys.replace(keys)
        self._limiter.replace_keys(keys)
        self._told("keys_replaced", keys)

    def limits_replaced(self, limits: Mapping[str, Limits]) -> None:
        """The limits by subject (``key:ID`` or an owner's text) as they are now; counts are kept."""
        self._limiter.replace_limits(limits)
        self._told("limits_replaced", dict(limits))

    def limits_shared(self, shares: PlaneShares) -> None:
        """Each serving plane's share of every rate and concurrency limit, as the leader divided them."""
        self._limiter.shared(shares)
        self._told("limits_shared", shares)

    def prices_replaced(self, prices: Prices) -> None:
        """The models' prices and the currency as they are now: requests ending from now on cost them."""
        self._limiter.prices = prices
        self._told("prices_replaced", prices)

    def limits_counted(self, used: Mapping[str, tuple[int, int]]) -> None:
        """Tokens spent this UTC day and month per subject, as the store holds them (on leading)."""
        self._limiter.counted(used)
        self._told("limits_counted", dict(used))

    def kv_blocks(self, update: KvBlocksUpdate) -> None:
        """A replica's engine stored or freed KV blocks: the router mirrors them."""
        router = self._replicas.router
        router.set_block_hashing(
            update.replica_id, update.model, update.hash_seed, update.block_size, update.mismatch
        )
        if update.reset:
            router.kv.clear(update.replica_id)
        router.kv.stored(update.replica_id, update.stored)
        router.kv.removed(update.replica_id, update.removed)
        self._told("kv_blocks", update)

    def set_stopped(self, stopped: bool) -> None:
        """``llmgw stop`` (True) or ``llmgw start`` (False)."""
        self.stopped = stopped
        self._told("set_stopped", stopped)

    # -- questions from the control plane ----------------------------------------------------------

    def limits_unsaved(self) -> dict[str, int]:
        """Tokens counted per limited subject since the last call: the control plane writes them."""
        return self._limiter.unsaved()

    def in_flight(self, model: str) -> int:
        """Requests this gateway has on ``model``'s ready replicas now."""
        replicas = self._replicas
        return sum(replicas.in_flight(endpoint.replica_id) for endpoint in replicas.ready(model))

    def replica_in_flight(self, replica_id: str) -> int:
        """Requests this gateway has on the replica now, draining or not."""
        return self._replicas.in_flight(replica_id)

    def model_load(self, model: str) -> ModelLoad:
        """What this gateway sees of ``model``'s load: autoscaling's input."""
        return self._replicas.model_load(model)

    def served_model(self, name: str) -> str:
        """The catalog model a request for ``name`` keeps in use: an adapter's base model, an
        environment member's entry, else ``name``."""
        adapter = self._adapters.get(name)
        if adapter is not None:
            return adapter.model
        entry = self._catalog.get(name)
        return entry.served_by if entry is not None and entry.served_by else name
