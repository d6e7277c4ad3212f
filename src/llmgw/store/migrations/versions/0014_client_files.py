"""Client files (OpenAI's Files API): each file's owner, purpose and name, its bytes a mirror blob.

Revision ID: 0014
Revises: 0013
Created: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "client_files",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("owner", sa.String(256), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("filename", sa.String(512), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_client_files"),
    )
    op.create_index("ix_client_files_owner", "client_files", ["owner"])
    op.create_index("ix_client_files_sha256", "client_files", ["sha256"])
    op.create_index("ix_client_files_expires_at", "client_files", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_client_files_expires_at", "client_files")
    op.drop_index("ix_client_files_sha256", "client_files")
    op.drop_index("ix_client_files_owner", "client_files")
    op.drop_table("client_files")
