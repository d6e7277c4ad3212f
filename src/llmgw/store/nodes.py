"""Nodes: every machine whose agent has registered, with its last reported inventory.

Whether a node is connected right now is observed state, kept in the leader's
memory; this table remembers which nodes exist, where they were reached and
what they had, across restarts and failovers.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from llmgw.errors import NotFound
from llmgw.store.tables import NodeRow
from llmgw.store.upserting import dialect_insert, upsert

if TYPE_CHECKING:
    from llmgw.store.access import StoreAccess


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A node as last registered."""

    id: str
    address: str
    """Where its agent connected from, or the address it announced."""
    inventory: dict[str, Any]
    """Its devices, memory and engines, as the agent reported them."""
    first_seen: datetime
    last_seen: datetime


class Nodes:
    """Nodes by id: record a registration, read, list."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store

    async def upsert(self, node_id: str, address: str, inventory: dict[str, Any]) -> NodeRecord:
        """Record that ``node_id`` registered now, from ``address`` with ``inventory``.

        A new node gets ``first_seen``; a known one keeps it and gets a new
        ``last_seen``, address and inventory.
        """
        now = self._store.now()
        async with self._store.session() as session:
            values = {
                "id": node_id,
                "address": address,
                "inventory": dict(inventory),
                "first_seen": now,
                "last_seen": now,
            }
            updated = ("address", "inventory", "last_seen")
            row = await upsert(session, NodeRow, values, key="id", update=updated)
            return _record(row)

    async def upsert_many(self, registrations: builtins.list[tuple[str, str, dict[str, Any]]]) -> None:
        """Record many registrations (node id, address, inventory) as :meth:`upsert` does, in one
        transaction: a thousand nodes registering with a new leader at once are a few writes."""
        if not registrations:
            return
        now = self._store.now()
        async with self._store.session() as session:
            insert = dialect_insert(session.get_bind().dialect.name, NodeRow)
            for node_id, address, inventory in registrations:
                values = {
                    "id": node_id,
                    "address": address,
                    "inventory": dict(inventory),
                    "first_seen": now,
                    "last_seen": now,
                }
                statement = insert.values(values)
                statement = statement.on_conflict_do_update(
                    index_elements=["id"],
                    set_={
                        column: statement.excluded[column] for column in ("address", "inventory", "last_seen")
                    },
                )
                await session.execute(statement)

    async def get(self, node_id: str) -> NodeRecord:
        """The node with id ``node_id``; :class:`NotFound` when it never registered."""
        async with self._store.session() as session:
            row = await session.get(NodeRow, node_id)
            if row is None:
                raise NotFound(
                    f"node {node_id!r} has never registered",
                    hint="start llmgw agent run on that machine; llmgw ctl nodes lists the known nodes",
                )
            return _record(row)

    async def list(self) -> builtins.list[NodeRecord]:
        """Every node that ever registered, by id."""
        async with self._store.session() as session:
            return [_record(row) for row in await session.scalars(select(NodeRow).order_by(NodeRow.id))]


def _record(row: NodeRow) -> NodeRecord:
    return NodeRecord(
        id=row.id,
        address=row.address,
        inventory=row.inventory,
        first_seen=row.first_seen,
        last_seen=row.last_seen,
    )
