"""Kept responses (OpenAI's Responses API): what previous_response_id and /v1/responses/{id} read.

Revision ID: 0016
Revises: 0015
Created: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "kept_responses",
        sa.Column("response_id", sa.String(128), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("input_items", sa.JSON(), nullable=False),
        sa.Column("output_items", sa.JSON(), nullable=False),
        sa.Column("response", sa.JSON(), nullable=False),
        sa.Column("kept_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("response_id", name="pk_kept_responses"),
    )
    op.create_index("ix_kept_responses_key_id_kept_at", "kept_responses", ["key_id", "kept_at"])
    op.create_index("ix_kept_responses_expires_at", "kept_responses", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_kept_responses_expires_at", "kept_responses")
    op.drop_index("ix_kept_responses_key_id_kept_at", "kept_responses")
    op.drop_table("kept_responses")
