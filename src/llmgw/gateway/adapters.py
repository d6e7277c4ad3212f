"""LoRA adapters: the model a request names may be an adapter of a catalog model.

The catalog's adapters are registered here (:meth:`Adapters.replace`, or
:meth:`Adapters.register` one by one: the adapter's name, its base model, how
many adapters a replica holds at once). An adapter given to the engine at
start (``max_loaded`` 0: vLLM's ``--lora-modules``, llama.cpp's ``--lora``)
is served only by the replicas of its base model that were started with it:
each replica's agent reports the adapters its engine was given (their files on
its node, :meth:`Adapters.set_paths`), and a request naming the adapter goes to
one of those. A replica started before the adapter was added answers as the
plain base model, so it never gets the request; while none holds it, the
request waits as for a model with no ready replica (:meth:`Adapters.wait`) and
the reconciler rolls the model's replicas onto the adapter.

llama-server applies, to a request without a ``lora`` field, every adapter
it was given; so a request to a llama.cpp model with adapters names its
adapter by id (``"lora": [{"id": i, "scale": s}]``, the others at scale 0)
and a request for the model itself turns them all off (:meth:`Adapters.lora_choice`).

A model with ``max_loaded_adapters`` N runs vLLM with runtime LoRA; its
adapters' weights are on each replica's node, at the path the replica's agent
reported (:meth:`Adapters.set_paths`). A request naming one goes to
a replica of the base model chosen by :class:`llmgw.core.adapters.AdapterResidency`:
one holding the adapter unless saturated; else one with room, after
unloading its least recently used idle adapter. The load
(``POST /v1/load_lora_adapter``) happens once per replica however many
requests arrive together: the later ones wait on the first one's load.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import Counter

from llmgw.core.adapters import AdapterResidency
from llmgw.core.catalog import ModelDefinition
from llmgw.core.tenancy import CLUSTER, Owner
from llmgw.errors import EngineError
from llmgw.gateway.replicas import ReplicaEndpoint, ReplicaTable
from llmgw.gateway.upstream import UpstreamClient

log = logging.getLogger(__name__)

LOADS = Counter(
    "llmgw_adapter_loads", "LoRA adapters loaded on replicas at run time, by base model.", ["model"]
)
UNLOADS = Counter("llmgw_adapter_unloads", "LoRA adapters unloaded to make room, by base model.", ["model"])


@dataclass(frozen=True, slots=True)
class AdapterEntry:
    name: str
    model: str
    """The base model whose replicas serve it."""
    path: str = ""
    """Where an engine reads its weights (``lora_path``) when its replica reported no path of its own."""
    max_loaded: int = 0
    """Adapters a replica of the base model holds at once; 0: every replica has every adapter from start."""
    lora_id: int = -1
    """llama.cpp: the adapter's id in llama-server (its place on the command line); -1 elsewhere."""
    scale: float = 1.0
    """llama.cpp: the scale a request for the adapter applies it at."""
    owner: Owner = CLUSTER
    """Who owns the adapter (its own owner, else its model's): only keys that see it may name it."""

    @property
    def at_start(self) -> bool:
        """Given to the engine at start: only the replicas started with it serve it."""
        return self.max_loaded == 0


def adapter_entries(models: Iterable[ModelDefinition]) -> list[AdapterEntry]:
    """The catalog's adapters as the gateway registers them."""
    entries = []
    for model in models:
        in_body = model.profile.capabilities.adapter_in_body
        for index, adapter in enumerate(model.adapters):
            entries.append(
                AdapterEntry(
                    adapter.name,
                    model.name,
                    max_loaded=model.profile.max_loaded_adapters,
                    lora_id=index if in_body else -1,
                    scale=1.0 if adapter.scale is None else adapter.scale,
                    owner=model.adapter_owner(adapter),
                )
            )
    return entries


class AdapterLoadFailed(EngineError):
    """A replica refused or failed to load an adapter."""


class Adapters:
    """Registered adapters, where each is loaded, and the loads in progress."""

    def __init__(self, table: ReplicaTable, upstream: UpstreamClient) -> None:
        self.table = table
        self.upstream = upstream
        self._entries: dict[str, AdapterEntry] = {}
        self._residency: dict[str, AdapterResidency] = {}
        self._loading: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._paths: dict[str, dict[str, str]] = {}
        self._choices: dict[str, bytes] = {}

    def register(self, name: str, model: str, path: str = "", max_loaded: int = 0) -> None:
        """Make ``name`` an adapter of ``model`` (replicas hold ``max_loaded`` at once; 0: all from start)."""
        self._entries[name] = AdapterEntry(name, model, path, max_loaded)
        if max_loaded:
            residency = self._residency.get(model)
            if residency is None or residency.max_loaded != max_loaded:
                self._residency[model] = AdapterResidency(max_loaded)

    def replace(self, entries: Iterable[AdapterEntry]) -> None:
        """Make ``entries`` every adapter there is (the catalog changed); what replicas hold is kept."""
        self._entries = {}
        self._choices = {}
        for entry in entries:
            self.register(entry.name, entry.model, entry.path, entry.max_loaded)
            self._entries[entry.name] = entry
            if entry.lora_id >= 0:
                choice = [{"id": entry.lora_id, "scale": entry.scale}]
                self._choices[entry.name] = json.dumps(choice, separators=(",", ":")).encode()
                self._choices.setdefault(entry.model, b'[{"id":0,"scale":0.0}]')  # the model alone: none
        runtime = {e.model for e in self._entries.values() if not e.at_start}
        for model in [m for m in self._residency if m not in runtime]:
            del self._residency[model]

    def set_paths(self, replica_id: str, paths: Mapping[str, str]) -> None:
        """Where each adapter's weights are on ``replica_id``'s node, as its agent reported."""
        self._paths[replica_id] = dict(paths)

    def lora_choice(self, model: str) -> bytes | None:
        """llama.cpp: the ``lora`` field a request for ``model`` (an adapter or its model) carries."""
        return self._choices.get(model)

    def entries(self) -> list[AdapterEntry]:
        """Every registered adapter, by name."""
        return sorted(self._entries.values(), key=lambda entry: entry.name)

    def get(self, name: str) -> AdapterEntry | None:
        return self._entries.get(name)

    def any_at_run_time(self) -> bool:
        """Whether an adapter is loaded at run time (``max_loaded``): looked at for every request a
        gateway worker or a standby serves, so nothing is sorted or copied."""
        return any(not entry.at_start for entry in self._entries.values())

    def residency(self, model: str) -> AdapterResidency | None:
        return self._residency.get(model)

    def forget(self, replica_id: str) -> None:
        """The replica left or restarted: it holds no adapter."""
        self._paths.pop(replica_id, None)
        for residency in self._residency.values():
            residency.forget(replica_id)

    def holds(self, replica_id: str, name: str) -> bool:
        """Whether ``replica_id``'s engine was started with adapter ``name`` (its agent reported it)."""
        return name in self._paths.get(replica_id, ())

    def servable(self, name: str) -> bool:
        """Whether a request naming adapter ``name`` can be placed now: a ready replica of its base
        model holds it (given at start), or any ready replica can load it (at run time)."""
        entry = self._entries.get(name)
        if entry is None:
            return False
        ready = self.table.ready(entry.model)
        if not entry.at_start:
            return bool(ready)
        return any(self.holds(endpoint.replica_id, name) for endpoint in ready)

    async def wait(self, name: str, timeout_s: float) -> bool:
        """Wait until :meth:`servable` (a replica holding ``name`` became ready); False when
        ``timeout_s`` passed first."""
        entry = self._entries.get(name)
        if entry is None:
            return False
        return await self.table.wait_until(entry.model, lambda: self.servable(name), timeout_s)

    async def place(self, name: str, request_id: bytes) -> ReplicaEndpoint | None:
        """A replica holding adapter ``name`` (loading it there first if need be); None if none can.

        The request counts as using the adapter there from the moment it is placed (so no other
        request unloads it meanwhile): call :meth:`done` when it ends. Raises
        :class:`AdapterLoadFailed` when the replica refused the load.
        """
        entry = self._entries[name]
        if entry.at_start:
            ready = self.table.ready(entry.model)
            without = [e.replica_id for e in ready if not self.holds(e.replica_id, name)]
            return self.table.pick(entry.model, exclude=without)
        residency = self._residency[entry.model]
        loads = self.table.loads(entry.model)
        plan = residency.plan(name, loads, saturation=self.table.router.settings.saturation)
        if plan is None:
            return None
        endpoint = self.table.get(plan.replica_id)
        if endpoint is None:
            return None
        key = (plan.replica_id, name)
        pending = self._loading.get(key)
        residency.begin(plan.replica_id, name)
        try:
            await self._ready(residency, plan.replica_id, plan.load, plan.unload, pending, entry, endpoint,
                              request_id)  # fmt: skip
        except BaseException:
            residency.end(plan.replica_id, name)
            raise
        return endpoint

    def done(self, replica_id: str, name: str) -> None:
        """A request placed by :meth:`place` ended."""
        entry = self._entries.get(name)
        residency = None if entry is None else self._residency.get(entry.model)
        if residency is not None:
            residency.end(replica_id, name)

    async def _ready(
        self,
        residency: AdapterResidency,
        replica_id: str,
        load: bool,
        unload: str | None,
        pending: asyncio.Future[None] | None,
        entry: AdapterEntry,
        endpoint: ReplicaEndpoint,
        request_id: bytes,
    ) -> None:
        name = entry.name
        key = (replica_id, name)
        if load:
            # The slot was reserved by begin() (the event loop runs one plan at a time); load.
            if unload is not None:
                residency.mark_unloaded(replica_id, unload)
            pending = self._loading[key] = asyncio.get_running_loop().create_future()
            try:
                await self._load(endpoint, entry, unload, request_id)
            except BaseException as error:
                residency.mark_unloaded(replica_id, name)
                pending.set_exception(
                    error if isinstance(error, AdapterLoadFailed) else AdapterLoadFailed(str(error))
                )
                pending.exception()  # retrieved: the waiters see it, nobody else must
                raise
            else:
                pending.set_result(None)
            finally:
                del self._loading[key]
        elif pending is not None:
            await asyncio.shield(pending)

    async def _post(
        self, endpoint: ReplicaEndpoint, path: str, body: dict[str, str], request_id: bytes
    ) -> None:
        response = await self.upstream.post(endpoint, path, json.dumps(body).encode(), request_id)
        text = await response.read()
        response.release()
        if response.status != 200:
            raise AdapterLoadFailed(
                f"replica {endpoint.replica_id} answered {response.status} to {path}: "
                f"{text.decode(errors='replace')[:300]}",
                hint="check the adapter's path and the model's max_loaded_adapters",
            )

    async def _load(
        self, endpoint: ReplicaEndpoint, entry: AdapterEntry, unload: str | None, request_id: bytes
    ) -> None:
        if unload is not None:
            await self._post(endpoint, "/v1/unload_lora_adapter", {"lora_name": unload}, request_id)
            UNLOADS.labels(entry.model).inc()
            log.info("adapter %s unloaded from %s to make room", unload, endpoint.replica_id)
        path = self._paths.get(endpoint.replica_id, {}).get(entry.name) or entry.path
        if not path:
            raise AdapterLoadFailed(
                f"replica {endpoint.replica_id} reported no path for adapter {entry.name}",
                hint="the node fetches an adapter with the model's weights; restart the replica "
                "('llmgw ctl replicas' shows it) if its node was upgraded from an older llmgw",
            )
        body = {"lora_name": entry.name, "lora_path": path}
        await self._post(endpoint, "/v1/load_lora_adapter", body, request_id)
        LOADS.labels(entry.model).inc()
        log.info("adapter %s loaded on %s", entry.name, endpoint.replica_id)
