"""The leader lease, on the database's own clock, and the fence that refuses a deposed leader's writes.

::

    leases = Leases(store)
    epoch = await leases.acquire("cp1", ttl_s=10)      # None: another control plane leads
    store.fence = Fence("cp1", epoch)                  # every write now checks the epoch
    assert await leases.renew("cp1", epoch, ttl_s=10)  # False: the lease changed hands

The lease is one row: who holds it, its epoch (grown by one each time it
changes hands) and when it expires, in seconds on the database's clock
(``clock_timestamp()`` on PostgreSQL, ``julianday('now')`` on SQLite), so no
machine's own clock decides who leads. A :class:`Fence` set on the store makes
every write transaction read the lease row first (``FOR SHARE`` on
PostgreSQL, so a take-over waits for it) and refuse with
:class:`~llmgw.errors.NotLeader` unless the lease is still this holder's at
this epoch: a leader that was deposed while it slept cannot write, whatever
it believes.

The lease's own statements run on a plain connection, outside any fence;
its reads run again once on a fresh connection when a failover took the
first one away (:meth:`~llmgw.store.database.Store.read`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from llmgw.errors import NotLeader

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session

    from llmgw.store.access import StoreAccess

NOW_SQL = {
    "postgresql": "extract(epoch from clock_timestamp())",
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
}
"""The database's clock, in seconds since 1970, by dialect."""


@dataclass
class Fence:
    """Who may write: ``name`` at ``epoch``; ``epoch`` None refuses every write (a standby)."""

    name: str
    epoch: int | None = None


@dataclass(frozen=True, slots=True)
class LeaseState:
    """The lease as the database sees it now."""

    holder: str
    """The control plane holding it, or "" when none ever did."""
    epoch: int
    expires_in_s: float
    """Seconds until it lapses on the database's clock; negative once it has."""

    @property
    def held(self) -> bool:
        return bool(self.holder) and self.expires_in_s > 0


@dataclass(frozen=True, slots=True)
class ControlPlaneRecord:
    """A control plane that announced itself."""

    name: str
    agent_address: str
    """host:port of its agent server (gRPC, mutual TLS)."""
    http_address: str
    """Base URL of its /v1, /api and /leader."""
    seen_ago_s: float
    """Seconds since it last announced itself, on the database's clock."""


class Leases:
    """Acquire, renew and release the leader lease; announce and list control planes.

    ``skew`` is added to the database's clock: production leaves it at zero;
    tests move it to let time pass without waiting.
    """

    def __init__(self, store: StoreAccess, skew: Callable[[], float] = lambda: 0.0) -> None:
        self._store = store
        self._skew = skew

    def _now(self) -> str:
        return f"({NOW_SQL[self._store.url.get_backend_name()]} + :skew)"

    async def _run(self, sql: str, **params: Any) -> list[Any]:
        async with self._store.bounded(), self._store.engine.begin() as connection:
            result = await connection.execute(text(sql), {"skew": self._skew(), **params})
            return list(result.all()) if result.returns_rows else []

    async def _read(self, sql: str) -> list[Any]:
        async def read(session: AsyncSession) -> list[Any]:
            return list((await session.execute(text(sql), {"skew": self._skew()})).all())

        return await self._store.read(read)

    async def acquire(self, name: str, ttl_s: float) -> int | None:
        """Take the lease if it lapsed (or ``name`` already holds it): the new epoch, or None."""
        now = self._now()
        rows = await self._run(
            f"UPDATE leadership SET holder = :name, epoch = epoch + 1, expires_s = {now} + :ttl "
            f"WHERE id = 1 AND (expires_s < {now} OR holder = :name OR holder = '') RETURNING epoch",
            name=name,
            ttl=ttl_s,
        )
        return int(rows[0][0]) if rows else None

    async def renew(self, name: str, epoch: int, ttl_s: float) -> bool:
        """Extend the lease ``name`` holds at ``epoch``; False when it changed hands meanwhile."""
        rows = await self._run(
            f"UPDATE leadership SET expires_s = {self._now()} + :ttl "
            "WHERE id = 1 AND holder = :name AND epoch = :epoch RETURNING epoch",
            name=name,
            epoch=epoch,
            ttl=ttl_s,
        )
        return bool(rows)

    async def release(self, name: str, epoch: int) -> None:
        """Let the lease lapse now, so a standby takes it without waiting (a clean stop)."""
        await self._run(
            "UPDATE leadership SET expires_s = 0 WHERE id = 1 AND holder = :name AND epoch = :epoch",
            name=name,
            epoch=epoch,
        )

    async def current(self) -> LeaseState:
        """Who holds the lease and for how much longer."""
        rows = await self._read(
            f"SELECT holder, epoch, expires_s - {self._now()} FROM leadership WHERE id = 1"
        )
        holder, epoch, remaining = rows[0]
        return LeaseState(holder=str(holder), epoch=int(epoch), expires_in_s=float(remaining))

    async def announce(self, name: str, agent_address: str, http_address: str) -> None:
        """Record (or refresh) this control plane and where it is reached."""
        now = self._now()
        updated = await self._run(
            f"UPDATE control_planes SET agent_address = :agent, http_address = :http, seen_s = {now} "
            "WHERE name = :name RETURNING name",
            name=name,
            agent=agent_address,
            http=http_address,
        )
        if not updated:
            await self._run(
                "INSERT INTO control_planes (name, agent_address, http_address, seen_s) "
                f"VALUES (:name, :agent, :http, {now})",
                name=name,
                agent=agent_address,
                http=http_address,
            )

    async def control_planes(self) -> list[ControlPlaneRecord]:
        """Every control plane that ever announced itself, by name."""
        rows = await self._read(
            f"SELECT name, agent_address, http_address, {self._now()} - seen_s FROM control_planes "
            "ORDER BY name"
        )
        return [ControlPlaneRecord(str(n), str(a), str(h), float(s)) for n, a, h, s in rows]

    async def forget(self, name: str) -> None:
        """Remove a control plane from the list (its certificate no longer reaches the leader)."""
        await self._run("DELETE FROM control_planes WHERE name = :name", name=name)


def check_fence(session: Session, fence: Fence) -> None:
    """Refuse the transaction unless the lease is still ``fence.name``'s at ``fence.epoch``.

    Runs inside the writing transaction, before its first write.
    """
    if session.info.get("fenced"):
        return
    session.info["fenced"] = True
    if fence.epoch is None:
        raise NotLeader(
            f"control plane {fence.name} does not lead, so it does not write to the store",
            hint="send the request to the leader (GET /leader on each control plane says which)",
        )
    lock = " FOR SHARE" if session.get_bind().dialect.name == "postgresql" else ""
    row = session.execute(text(f"SELECT holder, epoch FROM leadership WHERE id = 1{lock}")).one()
    if row[0] != fence.name or int(row[1]) != fence.epoch:
        raise NotLeader(
            f"control plane {fence.name} lost the lease (epoch {fence.epoch}; now {row[0] or 'nobody'} "
            f"at epoch {row[1]}): its write was refused",
            hint="send the request to the leader (GET /leader on each control plane says which)",
        )
