"""Migration 0019: llama.cpp profiles' ``ctx_size`` becomes per request, so engines start as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from llmgw.core.catalog import parse_model
from llmgw.engines.llamacpp import total_context
from llmgw.store import Store
from llmgw.store.database import MIGRATIONS

SOURCE = {"sha256": "a" * 64}
BEFORE: dict[str, list[dict[str, Any]]] = {
    "defaults": [{}],
    "four-slots": [{"engine": "llama.cpp", "ctx_size": 2048, "parallel": 4}],
    "rounded": [{"ctx_size": 1000, "parallel": 3}],
    "tiny": [{"ctx_size": 2, "parallel": 4}],
    "vllm": [{"engine": "vllm", "ctx_size": 2048, "parallel": 4}],
    "mixed": [{"engine": "vllm", "ctx_size": 8192}, {"ctx_size": 4096, "parallel": 2}],
}


def _config(connection: sa.Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("path_separator", "os")
    config.attributes["connection"] = connection
    return config


def _at_0018(path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        command.upgrade(_config(connection), "0018")
        for name, profiles in BEFORE.items():
            connection.execute(
                sa.text(
                    "INSERT INTO models (name, definition, created_at, updated_at, owner_kind, owner_path) "
                    "VALUES (:name, :definition, '2026-12-02 00:00:00', '2026-12-02 00:00:00', 'cluster', '')"
                ),
                {
                    "name": name,
                    "definition": json.dumps({"name": name, "source": SOURCE, "profiles": profiles}),
                },
            )
    engine.dispose()


async def _profiles(path: Path) -> dict[str, list[dict[str, Any]]]:
    store = await Store.open(f"sqlite+aiosqlite:///{path}")
    try:
        return {record.name: record.definition["profiles"] for record in await store.models.list()}
    finally:
        await store.close()


async def test_llamacpp_profiles_keep_the_context_their_engines_were_started_with(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.db"
    _at_0018(path)
    after = await _profiles(path)
    assert after["defaults"] == [{"ctx_size": 1024, "parallel": 4}]
    assert after["four-slots"] == [{"engine": "llama.cpp", "ctx_size": 512, "parallel": 4}]
    assert after["rounded"] == [{"ctx_size": 333, "parallel": 3}]
    assert after["tiny"] == [{"ctx_size": 1, "parallel": 4}]
    for name in ("defaults", "four-slots"):
        profile = parse_model({"name": name, "source": SOURCE, "profiles": after[name]}).profile
        was = BEFORE[name][0].get("ctx_size", 4096)
        assert total_context(profile.ctx_size, profile.parallel) == was


async def test_profiles_of_other_engines_keep_their_context(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.db"
    _at_0018(path)
    after = await _profiles(path)
    assert after["vllm"] == BEFORE["vllm"]
    assert after["mixed"] == [{"engine": "vllm", "ctx_size": 8192}, {"ctx_size": 2048, "parallel": 2}]


async def test_downgrading_gives_llamacpp_its_total_context_back(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.db"
    _at_0018(path)
    await _profiles(path)  # opening upgrades to the head
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        command.downgrade(_config(connection), "0018")
        rows = connection.execute(sa.text("SELECT name, definition FROM models")).all()
    engine.dispose()
    back = {name: json.loads(definition)["profiles"] for name, definition in rows}
    assert back["four-slots"] == BEFORE["four-slots"]
    assert back["defaults"] == [{"ctx_size": 4096, "parallel": 4}]
    assert back["vllm"] == BEFORE["vllm"]
