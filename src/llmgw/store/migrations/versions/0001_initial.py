"""The first schema: catalog, replicas, nodes, API keys, settings and their history, audit, blobs.

Revision ID: 0001
Revises:
Created: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _timestamp(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _serial() -> sa.Column:
    return sa.Column(
        "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True
    )


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("definition", sa.JSON(), nullable=False),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.PrimaryKeyConstraint("name", name="pk_models"),
    )
    op.create_table(
        "replicas",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("api_key", sa.String(128), nullable=False),
        sa.Column("devices", sa.JSON(), nullable=False),
        sa.Column("memory_mb", sa.Integer(), nullable=False),
        _timestamp("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_replicas"),
        sa.ForeignKeyConstraint(
            ["model"], ["models.name"], name="fk_replicas_model_models", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_replicas_model", "replicas", ["model"])
    op.create_index("ix_replicas_node_id", "replicas", ["node_id"])
    op.create_table(
        "nodes",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("address", sa.String(512), nullable=False),
        sa.Column("inventory", sa.JSON(), nullable=False),
        _timestamp("first_seen"),
        _timestamp("last_seen"),
        sa.PrimaryKeyConstraint("id", name="pk_nodes"),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        _timestamp("created_at"),
        _timestamp("revoked_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_keys"),
    )
    op.create_index("ix_api_keys_secret_hash", "api_keys", ["secret_hash"], unique=True)
    op.create_index(
        "uq_api_keys_active_name",
        "api_keys",
        ["name"],
        unique=True,
        sqlite_where=sa.text("revoked_at IS NULL"),
        postgresql_where=sa.text("revoked_at IS NULL"),
    )
    op.create_table(
        "settings",
        sa.Column("key", sa.String(256), nullable=False),
        sa.Column("value", sa.JSON(), nullable=True),
        _timestamp("updated_at"),
        sa.PrimaryKeyConstraint("key", name="pk_settings"),
    )
    op.create_table(
        "settings_history",
        _serial(),
        sa.Column("key", sa.String(256), nullable=False),
        sa.Column("value", sa.JSON(), nullable=True),
        _timestamp("changed_at"),
        sa.Column("actor", sa.String(256), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_settings_history"),
    )
    op.create_index("ix_settings_history_key", "settings_history", ["key"])
    op.create_table(
        "audit",
        _serial(),
        _timestamp("at"),
        sa.Column("actor", sa.String(256), nullable=False),
        sa.Column("action", sa.String(128), nullable=False),
        sa.Column("target", sa.String(512), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit"),
    )
    op.create_index("ix_audit_at", "audit", ["at"])
    op.create_table(
        "blobs",
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("filename", sa.String(512), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        _timestamp("created_at"),
        sa.PrimaryKeyConstraint("sha256", name="pk_blobs"),
    )


def downgrade() -> None:
    op.drop_table("blobs")
    op.drop_index("ix_audit_at", table_name="audit")
    op.drop_table("audit")
    op.drop_index("ix_settings_history_key", table_name="settings_history")
    op.drop_table("settings_history")
    op.drop_table("settings")
    op.drop_index("uq_api_keys_active_name", table_name="api_keys")
    op.drop_index("ix_api_keys_secret_hash", table_name="api_keys")
    op.drop_table("api_keys")
    op.drop_table("nodes")
    op.drop_index("ix_replicas_node_id", table_name="replicas")
    op.drop_index("ix_replicas_model", table_name="replicas")
    op.drop_table("replicas")
    op.drop_table("models")
