"""Alembic's entry point for llmgw's store.

:meth:`llmgw.store.database.Store.open` runs the migrations itself, handing
its connection over in ``config.attributes["connection"]``. For writing a new
migration by hand, the ``alembic`` command works too::

    alembic -c src/llmgw/store/alembic.ini -x url=sqlite+aiosqlite:///tmp/store.db upgrade head
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from llmgw.store.tables import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("give the database with -x url=sqlite+aiosqlite:///path/to/store.db")
    return url


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_online() -> None:
    engine = create_async_engine(_url())
    try:
        async with engine.begin() as connection:
            await connection.run_sync(_run)
    finally:
        await engine.dispose()


def _run_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    _run_offline()
elif (given := config.attributes.get("connection")) is not None:
    _run(given)
else:
    asyncio.run(_run_online())
