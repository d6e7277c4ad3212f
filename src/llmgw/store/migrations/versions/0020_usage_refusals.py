"""Usage counts the requests refused before any replica took them: a row's ``refused`` is the status
they were refused with (400, 404, 429, 503 …), 0 for requests a replica took (every row before).

Revision ID: 0020
Revises: 0019
Created: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("usage") as batch:
        batch.add_column(sa.Column("refused", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("usage") as batch:
        batch.drop_column("refused")
