"""The audit log: every administrative action, who did it, to what, and when.

Entries are only ever appended; reading them back gives the newest first.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from llmgw.store.tables import AuditRow

if TYPE_CHECKING:
    from llmgw.store.access import StoreAccess


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One recorded action."""

    id: int
    """Increases with every entry: a later entry has a larger id."""
    at: datetime
    actor: str
    """Who acted: a key id, a user, or ``system`` for the control plane itself."""
    action: str
    """What was done, like ``models.add`` or ``keys.revoke``."""
    target: str
    """What it was done to, like a model's name or a key's id."""
    detail: dict[str, Any]


class AuditLog:
    """Append actions and read back the latest."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store

    async def record(
        self, actor: str, action: str, target: str, detail: dict[str, Any] | None = None
    ) -> AuditEntry:
        """Append one action to the log."""
        row = AuditRow(
            at=self._store.now(), actor=actor, action=action, target=target, detail=dict(detail or {})
        )
        async with self._store.session() as session:
            session.add(row)
            await session.flush()
            return _entry(row)

    async def list(self, limit: int = 100) -> builtins.list[AuditEntry]:
        """The last ``limit`` actions, newest first."""
        query = select(AuditRow).order_by(AuditRow.id.desc()).limit(max(0, limit))
        async with self._store.session() as session:
            return [_entry(row) for row in await session.scalars(query)]


def _entry(row: AuditRow) -> AuditEntry:
    return AuditEntry(
        id=row.id, at=row.at, actor=row.actor, action=row.action, target=row.target, detail=row.detail
    )
