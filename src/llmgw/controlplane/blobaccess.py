"""Blob access: which caller of FetchBlob may have which blob of this plane's mirror.

A control plane's certificate (issued for server use, as no node's is) pulls
any blob: its replicator fills its own mirror from its peers'. A node's
certificate fetches only the files of the replicas placed on it. The leader
knows those in memory (:meth:`~llmgw.controlplane.fleet.Fleet.check_fetch`);
a standby, whose fleet is empty, reads them from the store (the replicas
placed on the node and their models' definitions), so a node whose leader
lacks a blob fetches it from a standby that holds it.
"""

from __future__ import annotations

from collections.abc import Callable

from llmgw.controlplane.fleet import Fleet, ReplicaState, shard_blobs
from llmgw.controlplane.shardspecs import shard_spec
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
            self._fleet.check_fetch(caller.name, sha256)
            return
        if sha256 not in await self.placed_files(caller.name):
            raise Unauthorized(
                f"node {caller.name} runs no replica with the file {sha256[:12]}…, so it may not fetch it",
                "a node fetches only the weights, files and adapters of the replicas placed on it "
                "('llmgw ctl replicas' shows where each one runs)",
            )

    async def placed_files(self, node_id: str) -> frozenset[str]:
        """Every mirrored file of the replicas the store places on ``node_id``."""
        placed = {r.model for r in await self._store.replicas.list() if r.node_id == node_id}
        found: set[str] = set()
        for record in await self._store.models.list():
            if record.name in placed:
                replica = ReplicaState(replica_id="", model=record.name, node_id=node_id, api_key="")
                found |= shard_blobs(shard_spec(replica, parse_model(record.definition)))
        return frozenset(found)
