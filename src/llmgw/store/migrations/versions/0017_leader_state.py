"""The leader's state a new leader carries on: replicas draining, adapter rolls' surges, the agents' rollout.

Revision ID: 0017
Revises: 0016
Created: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "replica_drains",
        sa.Column("replica_id", sa.String(64), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["replica_id"], ["replicas.id"], name="fk_replica_drains_replica_id_replicas", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("replica_id", name="pk_replica_drains"),
    )
    op.create_table(
        "roll_surges",
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("replica_id", sa.String(64), nullable=False),
        sa.ForeignKeyConstraint(
            ["model"], ["models.name"], name="fk_roll_surges_model_models", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["replica_id"], ["replicas.id"], name="fk_roll_surges_replica_id_replicas", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("model", name="pk_roll_surges"),
    )
    op.create_table(
        "agent_rollout",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("sums", sa.Text(), nullable=False),
        sa.Column("signature", sa.Text(), nullable=False),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("upgraded", sa.JSON(), nullable=False),
        sa.Column("current", sa.String(128), nullable=False),
        sa.Column("current_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("finished", sa.Boolean(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_agent_rollout"),
    )


def downgrade() -> None:
    op.drop_table("agent_rollout")
    op.drop_table("roll_surges")
    op.drop_table("replica_drains")
