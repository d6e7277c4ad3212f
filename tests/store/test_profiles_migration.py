"""Migration 0009: stored definitions with one ``profile`` become ``profiles``; replicas get their profile."""

from __future__ import annotations

import json
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from llmgw.core.catalog import parse_model
from llmgw.store import Store
from llmgw.store.database import MIGRATIONS

DEFINITION = {"name": "m", "source": {"sha256": "a" * 64}, "profile": {"ctx_size": 2048, "parallel": 1}}


def _at_0006(path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.set_main_option("path_separator", "os")
        config.attributes["connection"] = connection
        command.upgrade(config, "0006")
        connection.execute(
            sa.text(
                "INSERT INTO models (name, definition, created_at, updated_at, owner_kind, owner_path) "
                "VALUES ('m', :definition, '2026-11-30 00:00:00', '2026-11-30 00:00:00', 'cluster', '')"
            ),
            {"definition": json.dumps(DEFINITION)},
        )
        connection.execute(
            sa.text(
                "INSERT INTO replicas (id, model, node_id, api_key, devices, memory_mb, created_at) "
                "VALUES ('m-1', 'm', 'n1', 'k', '[]', 100, '2026-11-30 00:00:00')"
            )
        )
    engine.dispose()


async def test_one_profile_is_stored_as_a_list_of_one_and_replicas_run_the_first(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.db"
    _at_0006(path)
    store = await Store.open(f"sqlite+aiosqlite:///{path}")
    try:
        (record,) = await store.models.list()
        assert "profile" not in record.definition
        assert record.definition["profiles"] == [{"ctx_size": 2048, "parallel": 1}]
        assert parse_model(record.definition).profile.ctx_size == 2048
        (replica,) = await store.replicas.list()
        assert replica.profile == 0
    finally:
        await store.close()
