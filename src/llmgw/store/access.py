"""The store as its repositories see it: what a repository may ask of the database it works on.

Every repository (``Catalog``, ``Keys``, ``Leases``...) is built with the
store and keeps it, so it depends on a :class:`StoreAccess`, never on
:class:`~llmgw.store.database.Store` itself: ``database`` builds the
repositories and so imports them; the repositories import only this module,
and no import of the store runs in a circle, type-only ones included.

Invariants a :class:`StoreAccess` keeps (``Store`` keeps them): every call runs
under the store's one timeout and raises only llmgw's errors (``StoreError``,
``StoreUnavailable``), never a driver's; a session's block is one transaction.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, Protocol, TypeVar

from sqlalchemy import Executable, Result
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

T = TypeVar("T")


class Executes(Protocol):
    """Runs core statements inside one transaction: a sync ``Connection`` or ``Session``."""

    def execute(self, statement: Executable, params: Any = None, /) -> Result[Any]: ...


class StoreAccess(Protocol):
    """Sessions, retried reads, the store's clock and its database's dialect."""

    @property
    def engine(self) -> AsyncEngine:
        """The pooled engine, for statements a repository runs on a bare connection."""
        ...

    @property
    def url(self) -> URL:
        """The database's URL: its backend name picks the dialect's SQL."""
        ...

    def now(self) -> datetime:
        """The time stamped on records (the store's clock, wall time)."""
        ...

    def bounded(self) -> AbstractAsyncContextManager[None]:
        """Run a block under the store's timeout, translating the drivers' errors."""
        ...

    def session(self) -> AbstractAsyncContextManager[AsyncSession]:
        """One transaction: committed when the block ends, rolled back on an error."""
        ...

    async def read(self, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
        """Run ``work``, which only reads, once more on a fresh connection if the first was lost."""
        ...

    async def transact(self, work: Callable[[Executes], T]) -> T:
        """Run ``work``, one short transaction of core statements (sync), at the least cost the
        database allows: a SQLite file's in one hand-off to the store's own thread."""
        ...
