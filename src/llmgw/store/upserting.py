"""Insert-or-update of one row by its primary key, the same on SQLite and PostgreSQL.

Both dialects speak ``INSERT ... ON CONFLICT``; :func:`upsert` writes the one
statement and reads the row back as the database now holds it (the identity
map refreshed), so a repository never repeats the insert, the conflict clause
and the reselect.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from llmgw.store.tables import Base

RowT = TypeVar("RowT", bound=Base)


def dialect_insert(dialect_name: str, table: type[Base]) -> postgresql.Insert | sqlite.Insert:
    """An ``INSERT`` that knows ``ON CONFLICT`` on both SQLite and PostgreSQL."""
    if dialect_name == "postgresql":
        return postgresql.insert(table)
    if dialect_name == "sqlite":
        return sqlite.insert(table)
    raise ValueError(f"the store does not support {dialect_name!r} databases")


async def upsert(
    session: AsyncSession,
    table: type[RowT],
    values: Mapping[str, Any],
    *,
    key: str,
    update: Sequence[str] = (),
) -> RowT:
    """Insert the row of ``values``, or, where a row with the same ``key`` exists, set its ``update`` columns.

    ``key`` names the table's primary key column (which ``values`` holds);
    with no ``update`` columns an existing row is kept as it is. Returns the
    row as stored after the statement.
    """
    insert = dialect_insert(session.get_bind().dialect.name, table).values(dict(values))
    if update:
        statement = insert.on_conflict_do_update(
            index_elements=[key], set_={column: insert.excluded[column] for column in update}
        )
    else:
        statement = insert.on_conflict_do_nothing(index_elements=[key])
    await session.execute(statement)
    row = await session.get(table, values[key], populate_existing=True)
    if row is None:  # the statement above wrote or kept this very row
        raise RuntimeError(f"{table.__tablename__} row {values[key]!r} vanished right after its upsert")
    return row
