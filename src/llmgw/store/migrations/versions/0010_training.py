"""Training jobs: what each trains on, where it runs, how far it got, what it made.

Revision ID: 0010
Revises: 0009
Created: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "training_jobs",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("owner", sa.String(256), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("node", sa.String(128), nullable=False),
        sa.Column("node_id", sa.String(128), nullable=False),
        sa.Column("device", sa.String(32), nullable=False),
        sa.Column("memory_mb", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("retry", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("pairs", sa.LargeBinary(), nullable=False),
        sa.Column("progress", sa.JSON(), nullable=False),
        sa.Column("logs", sa.JSON(), nullable=False),
        sa.Column("results", sa.JSON(), nullable=False),
        sa.Column("reasons", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_training_jobs"),
    )
    op.create_index("ix_training_jobs_state", "training_jobs", ["state"])


def downgrade() -> None:
    op.drop_index("ix_training_jobs_state", "training_jobs")
    op.drop_table("training_jobs")
