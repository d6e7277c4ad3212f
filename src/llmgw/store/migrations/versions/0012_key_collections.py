"""API keys get default knowledge collections: what their chat and Responses requests search when
they name none (docs/knowledge.md). Existing keys search none.

Revision ID: 0012
Revises: 0011
Created: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("collections", sa.JSON(), nullable=False, server_default="[]"))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("collections")
