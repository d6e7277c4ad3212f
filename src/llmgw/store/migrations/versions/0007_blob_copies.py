"""Which control planes hold each blob of the mirror (a replicated mirror).

Revision ID: 0007
Revises: 0006
Created: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "blob_copies",
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("plane", sa.String(128), nullable=False),
        sa.Column("address", sa.String(512), nullable=False),
        sa.Column("copied_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("sha256", "plane", name="pk_blob_copies"),
    )


def downgrade() -> None:
    op.drop_table("blob_copies")
