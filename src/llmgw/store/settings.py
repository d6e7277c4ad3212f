"""Runtime settings: JSON values by key, with a history of every change and who made it.

A change and its history entry are written in one transaction, so the history
never misses a change nor records one that did not happen. What a key means
and which values it accepts is :mod:`llmgw.core`'s settings schema; the store
keeps any JSON value.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import null, select

from llmgw.errors import NotFound
from llmgw.store.tables import SettingChangeRow, SettingRow
from llmgw.store.upserting import upsert

if TYPE_CHECKING:
    from llmgw.store.access import StoreAccess


@dataclass(frozen=True, slots=True)
class SettingChange:
    """One change of a setting."""

    id: int
    key: str
    value: Any
    """The value set; ``None`` when the setting was deleted (see ``deleted``)."""
    deleted: bool
    """Whether this change deleted the setting (a value of JSON ``null`` is not a deletion)."""
    changed_at: datetime
    actor: str
    """Who made the change: a key id, a user, or ``system``."""


class StoredSettings:
    """Settings by key: read, set, delete, all at once, and their history."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store

    async def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` when it is not set."""
        async with self._store.session() as session:
            row = await session.get(SettingRow, key)
            return default if row is None else row.value

    async def set(self, key: str, value: Any, actor: str) -> None:
        """Set ``key`` to ``value`` (any JSON value) and record the change."""
        now = self._store.now()
        async with self._store.session() as session:
            values = {"key": key, "value": value, "updated_at": now}
            await upsert(session, SettingRow, values, key="key", update=("value", "updated_at"))
            session.add(SettingChangeRow(key=key, value=value, changed_at=now, actor=actor))

    async def delete(self, key: str, actor: str) -> None:
        """Delete ``key`` and record the deletion; :class:`NotFound` when it is not set."""
        async with self._store.session() as session:
            row = await session.get(SettingRow, key)
            if row is None:
                raise NotFound(
                    f"setting {key!r} is not set",
                    hint="check the setting's name; only a setting that is set can be removed",
                )
            await session.delete(row)
            session.add(SettingChangeRow(key=key, value=null(), changed_at=self._store.now(), actor=actor))

    async def all(self) -> dict[str, Any]:
        """Every setting that is set, by key."""
        async with self._store.session() as session:
            rows = await session.scalars(select(SettingRow).order_by(SettingRow.key))
            return {row.key: row.value for row in rows}

    async def history(self, key: str | None = None, limit: int = 100) -> list[SettingChange]:
        """The last ``limit`` changes, of ``key`` or of every setting, newest first."""
        query = (
            select(SettingChangeRow, SettingChangeRow.value.is_(None).label("deleted"))
            .order_by(SettingChangeRow.id.desc())
            .limit(max(0, limit))
        )
        if key is not None:
            query = query.where(SettingChangeRow.key == key)
        async with self._store.session() as session:
            result = await session.execute(query)
            return [
                SettingChange(
                    id=row.id,
                    key=row.key,
                    value=None if deleted else row.value,
                    deleted=bool(deleted),
                    changed_at=row.changed_at,
                    actor=row.actor,
                )
                for row, deleted in result
            ]
