"""Profiles as a list: each replica records the profile it runs; stored definitions say ``profiles``.

A definition with one ``profile`` becomes ``profiles: [profile]`` (the catalog
reads either; this makes the stored shape one). Downgrading turns a list of one
back into ``profile`` and leaves longer lists as they are.

Revision ID: 0009
Revises: 0006
Created: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_models = sa.table("models", sa.column("name", sa.String), sa.column("definition", sa.JSON))


def upgrade() -> None:
    with op.batch_alter_table("replicas") as batch:
        batch.add_column(sa.Column("profile", sa.Integer(), nullable=False, server_default="0"))
    _rewrite(_as_list)


def downgrade() -> None:
    _rewrite(_as_one)
    with op.batch_alter_table("replicas") as batch:
        batch.drop_column("profile")


def _rewrite(change: Any) -> None:
    bind = op.get_bind()
    for name, definition in bind.execute(sa.select(_models.c.name, _models.c.definition)).all():
        changed = change(definition)
        if changed is not None:
            bind.execute(_models.update().where(_models.c.name == name).values(definition=changed))


def _as_list(definition: Any) -> dict[str, Any] | None:
    if not isinstance(definition, dict) or "profile" not in definition or "profiles" in definition:
        return None
    rest = {k: v for k, v in definition.items() if k != "profile"}
    return {**rest, "profiles": [definition["profile"]]}


def _as_one(definition: Any) -> dict[str, Any] | None:
    if not isinstance(definition, dict) or len(definition.get("profiles") or ()) != 1:
        return None
    rest = {k: v for k, v in definition.items() if k != "profiles"}
    return {**rest, "profile": definition["profiles"][0]}
