"""Limits per subject (``key:ID``, project, team, organization, user) and the tokens each spent.

The limits are set through ``/api/limits`` and fed to the gateway, which
enforces them from memory. The tokens spent per UTC day and month
(``limit_counts``) are *added to* by every writer (:meth:`StoredLimits.add`:
``used = used + delta``), so one process or several may count at once, and
read back whole on leading (:meth:`StoredLimits.spent`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sqlalchemy import delete, select

from llmgw.core.limits import Limits, subject_text
from llmgw.errors import NotFound, ValidationFailed
from llmgw.store.tables import LimitCountRow, LimitRow
from llmgw.store.upserting import dialect_insert, upsert

if TYPE_CHECKING:
    from llmgw.store.access import StoreAccess


def day_period(now: float) -> str:
    return time.strftime("day:%Y-%m-%d", time.gmtime(now))


def month_period(now: float) -> str:
    return time.strftime("month:%Y-%m", time.gmtime(now))


def checked_subject(text: str) -> str:
    try:
        return subject_text(text)
    except ValueError as error:
        raise ValidationFailed(
            [("subject", str(error))], "name a key:ID, project, team, org or user"
        ) from None


class StoredLimits:
    """Set, read and remove limits; add and read the tokens spent against them."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store

    async def set(self, subject: str, limits: Limits) -> Limits:
        """Make ``limits`` the limits of ``subject`` (no limit at all removes the row)."""
        subject = checked_subject(subject)
        async with self._store.session() as session:
            if limits.empty:
                await session.execute(delete(LimitRow).where(LimitRow.subject == subject))
                return limits
            values = {"subject": subject, "limits": limits.as_dict(), "changed_at": self._store.now()}
            await upsert(session, LimitRow, values, key="subject", update=("limits", "changed_at"))
        return limits

    async def get(self, subject: str) -> Limits:
        """The limits of ``subject``; :class:`NotFound` when none are set."""
        subject = checked_subject(subject)
        async with self._store.session() as session:
            row = await session.get(LimitRow, subject)
            if row is None:
                raise NotFound(f"no limits are set on {subject}", "'llmgw ctl limits list' lists the limits")
            return Limits.from_dict(dict(row.limits))

    async def all(self) -> dict[str, Limits]:
        """Every subject's limits."""
        async with self._store.session() as session:
            rows = (await session.execute(select(LimitRow).order_by(LimitRow.subject))).scalars()
            return {row.subject: Limits.from_dict(dict(row.limits)) for row in rows}

    async def add(self, spent: Mapping[str, int], now: float) -> None:
        """Add tokens spent per subject to the day's and month's counts of Unix time ``now``."""
        if not spent:
            return
        periods = (day_period(now), month_period(now))
        values = [
            {"subject": subject, "period": period, "used": used}
            for subject, used in spent.items()
            for period in periods
        ]
        async with self._store.session() as session:
            insert = dialect_insert(session.get_bind().dialect.name, LimitCountRow).values(values)
            await session.execute(
                insert.on_conflict_do_update(
                    index_elements=["subject", "period"],
                    set_={"used": LimitCountRow.used + insert.excluded.used},
                )
            )

    async def spent(self, now: float) -> dict[str, tuple[int, int]]:
        """Tokens spent per subject in the UTC day and month of ``now``: (day, month)."""
        day, month = day_period(now), month_period(now)
        out: dict[str, tuple[int, int]] = {}
        async with self._store.session() as session:
            rows = await session.execute(select(LimitCountRow).where(LimitCountRow.period.in_((day, month))))
            for row in rows.scalars():
                d, m = out.get(row.subject, (0, 0))
                out[row.subject] = (row.used, m) if row.period == day else (d, row.used)
        return out

    async def forget_before(self, now: float) -> int:
        """Remove the counts of days before yesterday and months before the last (old counts)."""
        keep = (day_period(now - 86_400), day_period(now), month_period(now - 31 * 86_400), month_period(now))
        async with self._store.session() as session:
            result = await session.execute(delete(LimitCountRow).where(LimitCountRow.period.not_in(keep)))
            return int(getattr(result, "rowcount", 0) or 0)
