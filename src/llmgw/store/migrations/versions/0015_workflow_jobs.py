"""ComfyUI jobs: each job's ask, runner and progress, so that any process answers for it and the
leader takes over one whose runner died.

Revision ID: 0015
Revises: 0014
Created: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "workflow_jobs",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(256), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("served_by", sa.String(256), nullable=False),
        sa.Column("graph", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(12), nullable=False),
        sa.Column("progress", sa.JSON(), nullable=False),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("replica_id", sa.String(128), nullable=False),
        sa.Column("prompt_id", sa.String(128), nullable=False),
        sa.Column("runner", sa.String(256), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cancel_asked", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_workflow_jobs"),
    )
    op.create_index("ix_workflow_jobs_key_id", "workflow_jobs", ["key_id"])
    op.create_index("ix_workflow_jobs_state", "workflow_jobs", ["state"])
    op.create_index("ix_workflow_jobs_ended_at", "workflow_jobs", ["ended_at"])


def downgrade() -> None:
    op.drop_index("ix_workflow_jobs_ended_at", "workflow_jobs")
    op.drop_index("ix_workflow_jobs_state", "workflow_jobs")
    op.drop_index("ix_workflow_jobs_key_id", "workflow_jobs")
    op.drop_table("workflow_jobs")
