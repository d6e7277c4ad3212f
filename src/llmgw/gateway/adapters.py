"""LoRA adapters loaded at run time: the first request for one loads it, exactly once.

A model with ``max_loaded_adapters`` N runs vLLM with runtime LoRA; its
adapters are registered here (:meth:`Adapters.register`: the adapter's name,
its base model, where its weights are). A request naming an adapter goes to
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
from dataclasses import dataclass

from prometheus_client import Counter

from llmgw.core.adapters import AdapterResidency
from llmgw.errors import EngineError
from llmgw.gateway.replicas import ReplicaEndpoint, ReplicaTable
from llmgw.gateway.upstream import Upstream

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
    path: str
    """Where the replica's engine reads its weights (``lora_path``)."""


class AdapterLoadFailed(EngineError):
    """A replica refused or failed to load an adapter."""


class Adapters:
    """Registered adapters, where each is loaded, and the loads in progress."""

    def __init__(self, table: ReplicaTable, upstream: Upstream) -> None:
        self.table = table
        self.upstream = upstream
        self._entries: dict[str, AdapterEntry] = {}
        self._residency: dict[str, AdapterResidency] = {}
        self._loading: dict[tuple[str, str], asyncio.Future[None]] = {}

    def register(self, name: str, model: str, path: str, max_loaded: int) -> None:
        """Make ``name`` an adapter of ``model`` (whose replicas hold ``max_loaded`` at once)."""
        self._entries[name] = AdapterEntry(name, model, path)
        residency = self._residency.get(model)
        if residency is None or residency.max_loaded != max_loaded:
            self._residency[model] = AdapterResidency(max_loaded)

    def get(self, name: str) -> AdapterEntry | None:
        return self._entries.get(name)

    def residency(self, model: str) -> AdapterResidency | None:
        return self._residency.get(model)

    def forget(self, replica_id: str) -> None:
        """The replica left or restarted: it holds no adapter."""
        for residency in self._residency.values():
            residency.forget(replica_id)

    async def place(self, name: str, request_id: bytes) -> ReplicaEndpoint | None:
        """A replica holding adapter ``name`` (loading it there first if need be); None if none can.

        The request counts as using the adapter there from the moment it is placed (so no other
        request unloads it meanwhile): call :meth:`done` when it ends. Raises
        :class:`AdapterLoadFailed` when the replica refused the load.
        """
        entry = self._entries[name]
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
        body = {"lora_name": entry.name, "lora_path": entry.path}
        await self._post(endpoint, "/v1/load_lora_adapter", body, request_id)
        LOADS.labels(entry.model).inc()
        log.info("adapter %s loaded on %s", entry.name, endpoint.replica_id)
