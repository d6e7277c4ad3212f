"""Limits per key, project, team, organization or user, and the tokens each spent per day and month.

Revision ID: 0006
Revises: 0005
Created: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "limits",
        sa.Column("subject", sa.String(256), nullable=False),
        sa.Column("limits", sa.JSON(), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("subject", name="pk_limits"),
    )
    op.create_table(
        "limit_counts",
        sa.Column("subject", sa.String(256), nullable=False),
        sa.Column("period", sa.String(16), nullable=False),
        sa.Column("used", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("subject", "period", name="pk_limit_counts"),
    )


def downgrade() -> None:
    op.drop_table("limit_counts")
    op.drop_table("limits")
