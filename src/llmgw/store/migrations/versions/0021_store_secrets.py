"""The store's sealed secrets: the store key's check value; engine keys sealed from now on.

``replicas.api_key`` keeps its column: a sealed key (``enc1:`` and base64,
about 104 characters) fits it, and rows written before are read as they are
until the control plane that opens the store with its key seals them
(:mod:`llmgw.store.secretbox`).

Revision ID: 0021
Revises: 0020
Created: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "store_secrets",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_store_secrets"),
    )


def downgrade() -> None:
    op.drop_table("store_secrets")
