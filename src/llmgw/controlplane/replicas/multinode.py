"""Multi-node replicas (C5.5): one shard on each of several nodes, started together, failing together.

A replica placed on N nodes is N shards, each one record in the store and one
:class:`ReplicaState` in the fleet, on its own node: rank 0 keeps the
replica's id and is its *head* (it serves the requests, so it alone enters the
gateway's table); rank k is ``<id>.r<k>``. The id says the rank, so a new
leader rebuilds every replica from the store as it is.

The shards meet at a rendezvous address: the head node's address and a port
the reconciler derives from the replica's id (:func:`rendezvous_port`). The
reconciler chooses it, not the head's agent, so that every shard's StartShard
goes out in one pass with no round trip through the head first, and so that a
new leader sends the same address again without storing it. A port already
taken on the head node makes the head fail, which takes the replica down; it is
placed again under a new id, so with another port.

A replica stands or falls whole: once any shard fails, is restarted by its
agent after a failure (even one back to ready by the next pass: its restart
count says so), goes missing from its node, or its node is lost,
:func:`broken` says why, and the reconciler stops every shard and places the
replica again (engines' ranks cannot be restarted one at a time).
"""

from __future__ import annotations

import hashlib

from llmgw.controlplane.nodes.fleet import Fleet, ReplicaState
from llmgw.core.shards import Rendezvous, ReplicaPhase

RENDEZVOUS_PORTS = range(29500, 30000)
"""Where a replica's rendezvous port is taken from (29500: torch.distributed's usual port)."""

RANK_MARK = ".r"


def shard_id(replica_id: str, rank: int) -> str:
    """The id of the shard of rank ``rank`` (the head keeps the replica's id)."""
    return replica_id if rank == 0 else f"{replica_id}{RANK_MARK}{rank}"


def rank_of(identifier: str) -> tuple[str, int]:
    """(the replica's id, the rank) of a shard's id; a one-node replica is its own rank 0."""
    head, mark, rank = identifier.rpartition(RANK_MARK)
    if mark and head and rank.isdigit():
        return head, int(rank)
    return identifier, 0


def rendezvous_port(replica_id: str) -> int:
    """The port on the head's node where the replica's shards meet, the same for every leader."""
    digest = int.from_bytes(hashlib.sha256(replica_id.encode()).digest()[:4], "big")
    return RENDEZVOUS_PORTS[digest % len(RENDEZVOUS_PORTS)]


def shards_of(fleet: Fleet, replica_id: str) -> list[ReplicaState]:
    """Every shard of the replica ``replica_id`` the fleet tracks, head first, then by rank."""
    found = [r for r in fleet.replicas.values() if rank_of(r.replica_id)[0] == replica_id]
    return sorted(found, key=lambda r: rank_of(r.replica_id)[1])


def rendezvous(fleet: Fleet, shard: ReplicaState) -> Rendezvous | None:
    """What ``shard``'s StartShard says of its rendezvous; None for a one-node replica, or while
    the head's node is not connected (its address is unknown: the shard waits)."""
    if shard.nodes <= 1:
        return None
    replica_id, rank = rank_of(shard.replica_id)
    head = fleet.replicas.get(replica_id)
    node = fleet.nodes.get(head.node_id) if head is not None else None
    if node is None:
        return None
    return Rendezvous(
        rank=rank, nodes=shard.nodes, address=f"{node.inventory.address}:{rendezvous_port(replica_id)}"
    )


def broken(fleet: Fleet, shards: list[ReplicaState]) -> str:
    """Why a multi-node replica must be taken down and placed again; empty while it stands."""
    if len(shards) < max(s.nodes for s in shards):
        return f"{max(s.nodes for s in shards) - len(shards)} of its shards are gone"
    for shard in shards:
        where = f"shard {shard.replica_id} on {shard.node_id}"
        if shard.state is ReplicaPhase.FAILED:
            return f"{where} failed: {shard.error or 'no reason given'}"
        if shard.restarts or (shard.state is ReplicaPhase.STARTING and shard.error):
            return f"{where} was restarted by its node: {shard.error or 'its engine ended'}"
        if shard.node_id in fleet.nodes and shard.state in (ReplicaPhase.ABSENT, ReplicaPhase.STOPPED):
            return f"{where} is no longer running there"
        if fleet.lost(shard.node_id):
            return f"{where}: the node is lost"
    return ""
