"""Batches (OpenAI's Batch API): each batch and each of its requests, answered or not.

Revision ID: 0013
Revises: 0012
Created: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "batches",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("owner", sa.String(256), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("input_file_id", sa.String(64), nullable=False),
        sa.Column("completion_window", sa.String(8), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("completed", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_file_id", sa.String(64), nullable=False),
        sa.Column("error_file_id", sa.String(64), nullable=False),
        sa.Column("errors", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("times", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_batches"),
    )
    op.create_index("ix_batches_owner", "batches", ["owner"])
    op.create_index("ix_batches_status", "batches", ["status"])
    op.create_table(
        "batch_requests",
        sa.Column("batch_id", sa.String(40), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("custom_id", sa.String(512), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(12), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["batch_id"], ["batches.id"], name="fk_batch_requests_batch_id_batches", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("batch_id", "position", name="pk_batch_requests"),
        sa.UniqueConstraint("batch_id", "custom_id", name="uq_batch_requests_batch_id_custom_id"),
    )


def downgrade() -> None:
    op.drop_table("batch_requests")
    op.drop_index("ix_batches_status", "batches")
    op.drop_index("ix_batches_owner", "batches")
    op.drop_table("batches")
