"""Usage keeps what its requests cost and the prompt tokens engines found in their cache: a row's
``cost`` (in the cluster's currency, at the prices in force when each request ended) and
``cached_tokens``; 0 for every row before.

Revision ID: 0022
Revises: 0021
Created: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("usage") as batch:
        batch.add_column(sa.Column("cached_tokens", sa.BigInteger(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("cost", sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("usage") as batch:
        batch.drop_column("cost")
        batch.drop_column("cached_tokens")
