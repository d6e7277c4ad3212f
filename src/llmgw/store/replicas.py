"""Replicas: the desired state the reconciler writes — which model runs on which node and devices.

Whether a replica is actually up is observed state and lives in the leader's
memory; this table only says what should run, so a new leader can pick up
where the last one stopped. Removing a model removes its replicas with it.

A replica's engine key is stored sealed when the store has the cluster's key
(:mod:`llmgw.store.secretbox`) and opened as rows are read; rows written
before that are read as they are and sealed when the store opens
(:meth:`Replicas.seal_plain`).
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from llmgw.errors import Conflict, NotFound
from llmgw.store.secretbox import PREFIX, SecretBox, open_plain
from llmgw.store.tables import ModelRow, ReplicaRow, rowcount

if TYPE_CHECKING:
    from llmgw.store.access import StoreAccess


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class ReplicaRecord:
    """One replica of a model, placed on a node."""

    id: str
    model: str
    """The catalog name of the model it serves."""
    node_id: str
    api_key: str
    """The key the engine is started with; the gateway sends it on every proxied request."""
    devices: Sequence[int]
    """Indexes of the node's devices the replica runs on (kept as a tuple); empty on the CPU."""
    memory_mb: int
    created_at: datetime = field(default_factory=_utcnow)
    profile: int = 0
    """The index of the model's profile it runs."""

    def __post_init__(self) -> None:
        if not isinstance(self.devices, tuple):
            object.__setattr__(self, "devices", tuple(self.devices))


class Replicas:
    """Replicas by id: add, read, list (all, or one model's) and remove."""

    def __init__(self, store: StoreAccess, secrets: SecretBox | None = None) -> None:
        self._store = store
        self._secrets = secrets
        """Seals the engine keys written and opens those read (None: kept as they are)."""

    def _seal(self, replica: ReplicaRecord) -> str:
        if self._secrets is None:
            return replica.api_key
        return self._secrets.seal(replica.api_key, _row_name(replica.id))

    def _open(self, replica_id: str, stored: str) -> str:
        if self._secrets is None:
            return open_plain(stored, _row_name(replica_id))
        return self._secrets.open(stored, _row_name(replica_id))

    def _record(self, row: Any) -> ReplicaRecord:
        return _record(row, self._open(row.id, row.api_key))

    async def seal_plain(self) -> int:
        """Seal the engine keys stored before they were sealed; how many there were."""
        if self._secrets is None:
            return 0
        query = select(ReplicaRow.id, ReplicaRow.api_key).where(ReplicaRow.api_key.not_like(f"{PREFIX}%"))
        async with self._store.session() as session:
            plain = list(await session.execute(query))
            for replica_id, key in plain:
                sealed = self._secrets.seal(key, _row_name(replica_id))
                await session.execute(
                    update(ReplicaRow)
                    .where(ReplicaRow.id == replica_id, ReplicaRow.api_key == key)
                    .values(api_key=sealed)
                )
        return len(plain)

    async def add(self, replica: ReplicaRecord) -> ReplicaRecord:
        """Store a new replica.

        :class:`NotFound` when its model is not in the catalog, :class:`Conflict`
        when a replica with its id exists.
        """
        row = ReplicaRow(**self._values(replica))
        async with self._store.session() as session:
            if await session.get(ModelRow, replica.model) is None:
                raise NotFound(
                    f"model {replica.model!r} of replica {replica.id!r} is not in the catalog",
                    hint="add the model before its replicas; llmgw ctl models lists the catalog",
                )
            if await session.get(ReplicaRow, replica.id) is not None:
                raise _exists(replica.id)
            session.add(row)
            try:
                await session.flush()
            except IntegrityError:
                raise _exists(replica.id) from None
            return replica

    async def add_all(self, replicas: Sequence[ReplicaRecord]) -> builtins.list[ReplicaRecord]:
        """Store new replicas in one transaction (a reconcile pass's placements) and return those stored.

        A replica whose model is no longer in the catalog is left out (its model's removal took its
        replicas with it); :class:`Conflict` when a replica with one of their ids exists, and then
        none is stored.
        """
        if not replicas:
            return []
        async with self._store.session() as session:
            models: set[str] = set()
            for names in _chunks(sorted({r.model for r in replicas})):
                models.update(
                    (await session.execute(select(ModelRow.name).where(ModelRow.name.in_(names)))).scalars()
                )
            kept = [replica for replica in replicas if replica.model in models]
            for ids in _chunks([replica.id for replica in kept]):
                taken = (
                    (await session.execute(select(ReplicaRow.id).where(ReplicaRow.id.in_(ids))))
                    .scalars()
                    .first()
                )
                if taken is not None:
                    raise _exists(taken)
            if not kept:
                return []
            try:  # one executemany, not an ORM object per row: a fresh cluster's pass writes a thousand
                await session.execute(insert(ReplicaRow), [self._values(replica) for replica in kept])
            except IntegrityError:
                raise Conflict(
                    "a replica with one of these ids already exists", hint="give each replica a new id"
                ) from None
            return kept

    async def get(self, replica_id: str) -> ReplicaRecord:
        """The replica with id ``replica_id``; :class:`NotFound` when there is none."""
        async with self._store.session() as session:
            row = await session.get(ReplicaRow, replica_id)
            if row is None:
                raise _missing(replica_id)
            return self._record(row)

    async def remove(self, replica_id: str) -> None:
        """Forget the replica; :class:`NotFound` when there is none."""
        async with self._store.session() as session:
            result = await session.execute(delete(ReplicaRow).where(ReplicaRow.id == replica_id))
            if not rowcount(result):
                raise _missing(replica_id)

    async def list(self, model: str | None = None) -> builtins.list[ReplicaRecord]:
        """Every replica, or those of ``model``, oldest first."""
        # Columns, not ORM objects: a reconcile pass reads every replica, and a thousand ORM rows took
        # most of a pass.
        query = select(*_COLUMNS).order_by(ReplicaRow.created_at, ReplicaRow.id)
        if model is not None:
            query = query.where(ReplicaRow.model == model)
        async with self._store.session() as session:
            return [self._record(row) for row in await session.execute(query)]

    def _values(self, replica: ReplicaRecord) -> dict[str, Any]:
        return {
            "id": replica.id,
            "model": replica.model,
            "node_id": replica.node_id,
            "api_key": self._seal(replica),
            "devices": list(replica.devices),
            "memory_mb": replica.memory_mb,
            "created_at": replica.created_at,
            "profile": replica.profile,
        }


_COLUMNS = (ReplicaRow.id, ReplicaRow.model, ReplicaRow.node_id, ReplicaRow.api_key, ReplicaRow.devices,
            ReplicaRow.memory_mb, ReplicaRow.created_at, ReplicaRow.profile)  # fmt: skip


def _row_name(replica_id: str) -> str:
    """What a replica's sealed key is bound to: its table, column and id."""
    return f"replicas.api_key:{replica_id}"


def _chunks(values: builtins.list[str], size: int = 500) -> builtins.list[builtins.list[str]]:
    """``values`` in lists of at most ``size`` (the bound parameters one statement may take)."""
    return [values[i : i + size] for i in range(0, len(values), size)]


def _record(row: Any, api_key: str) -> ReplicaRecord:  # a ReplicaRow, or a row of _COLUMNS
    return ReplicaRecord(
        id=row.id,
        model=row.model,
        node_id=row.node_id,
        api_key=api_key,
        devices=tuple(int(device) for device in row.devices or ()),
        memory_mb=row.memory_mb,
        created_at=row.created_at,
        profile=row.profile or 0,
    )


def _exists(replica_id: str) -> Conflict:
    return Conflict(f"replica {replica_id!r} already exists", hint="give each replica a new id")


def _missing(replica_id: str) -> NotFound:
    return NotFound(f"replica {replica_id!r} does not exist", hint="llmgw ctl replicas lists the replicas")
