"""Blobs record who uploaded them, so an owner's mirror use is counted against a quota.

Revision ID: 0018
Revises: 0017
Created: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("blobs") as batch:
        batch.add_column(sa.Column("owner", sa.String(128), nullable=False, server_default=""))
    op.create_index("ix_blobs_owner", "blobs", ["owner"])


def downgrade() -> None:
    op.drop_index("ix_blobs_owner", table_name="blobs")
    with op.batch_alter_table("blobs") as batch:
        batch.drop_column("owner")
