"""Blob access: which caller of FetchBlob may have which blob of this plane's mirror.

A control plane's certificate (issued for server use, as no node's is) pulls
any blob: its replicator fills its own mirror from its peers'. A node's
certificate fetches only the files of the replicas placed on it. The leader
knows those in memory (:meth:`~llmgw.controlplane.nodes.fleet.Fleet.check_fetch`);
a standby, whose fleet is empty, reads them from the store (the replicas
placed on the node and their models' definitions), so a node whose leader
lacks a blob fetches it from a standby that holds it. A node also fetches
the base model's files of a training job placed on it (read from the store,
on the leader only when the node's replicas do not account for the blob).
"""

from __future__ import annotations

from collections.abc import Callable

from llmgw.controlplane.nodes.fleet import Fleet, ReplicaState, shard_blobs
from llmgw.controlplane.replicas.shardspecs import shard_spec
from llmgw.core.catalog import parse_model
from llmgw.core.relays import RelayPeer
from llmgw.errors import Unauthorized
from llmgw.store.database import Store


class BlobAccess:
    """Refuses (Unauthorized) a FetchBlob its caller may not make."""

    def __init__(self, store: Store, fleet: Fleet, leading: Callable[[], bool]) -> None:
        self._store = store
        self._fleet = fleet
        self._leading = leading

    async def check(self, caller: RelayPeer, sha256: str) -> None:
        if caller.control_plane:
            return
        if self._leading():
            try:
                self._fleet.check_fetch(caller.name, sha256)
                return
            except Unauthorized:
                if sha256 not in await self.training_files(caller.name):
                    raise
                return
        if sha256 not in await self.placed_files(caller.name) | await self.training_files(caller.name):
            raise Unauthorized(
                f"node {caller.name} runs no replica with the file {sha256[:12]}…, so it may not fetch it",
                "a node fetches only the weights, files and adapters of the replicas placed on it "
                "('llmgw ctl replicas' shows where each one runs)",
            )

    async def training_files(self, node_id: str) -> frozenset[str]:
        """The base files of the training jobs placed on ``node_id`` and not ended."""
        jobs = await self._store.training.list(unfinished=True)
        return frozenset(w["sha256"] for j in jobs if j.node_id == node_id for w in j.weights)

    async def placed_files(self, node_id: str) -> frozenset[str]:
        """Every mirrored file of the replicas the store places on ``node_id``."""
        placed = {r.model for r in await self._store.replicas.list() if r.node_id == node_id}
        found: set[str] = set()
        for record in await self._store.models.list():
            if record.name in placed:
                replica = ReplicaState(replica_id="", model=record.name, node_id=node_id, api_key="")
                found |= shard_blobs(shard_spec(replica, parse_model(record.definition)))
        return frozenset(found)
