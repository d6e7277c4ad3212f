"""Leadership: the leader lease (one row) and the control planes the store knows.

Revision ID: 0002
Revises: 0001
Created: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    lease = op.create_table(
        "leadership",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("holder", sa.String(128), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("expires_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_leadership"),
    )
    op.bulk_insert(lease, [{"id": 1, "holder": "", "epoch": 0, "expires_s": 0.0}])
    op.create_table(
        "control_planes",
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("agent_address", sa.String(512), nullable=False),
        sa.Column("http_address", sa.String(512), nullable=False),
        sa.Column("seen_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_control_planes"),
    )


def downgrade() -> None:
    op.drop_table("control_planes")
    op.drop_table("leadership")
