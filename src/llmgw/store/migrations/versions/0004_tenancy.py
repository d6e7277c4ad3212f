"""Tenancy: orgs, teams, projects, users, role bindings, user tokens; owners on models, places on keys.

A model's owner was a free label; it becomes a structured owner
(``owner_kind``, ``owner_path``, and the definition's ``owner`` in the same
text form). A label that names no owner (``org:…``, ``team:…``,
``project:…``, ``user:…``) becomes the cluster: the model stays visible to
every key, as it was. Existing keys sit nowhere (public models only) until
they are created again in a project or for a user.

Revision ID: 0004
Revises: 0003
Created: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from llmgw.core.tenancy import CLUSTER, Owner

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _timestamp(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "orgs",
        sa.Column("path", sa.String(64), nullable=False),
        _timestamp("created_at"),
        sa.PrimaryKeyConstraint("path", name="pk_orgs"),
    )
    op.create_table(
        "teams",
        sa.Column("path", sa.String(130), nullable=False),
        sa.Column("org", sa.String(64), nullable=False),
        _timestamp("created_at"),
        sa.PrimaryKeyConstraint("path", name="pk_teams"),
        sa.ForeignKeyConstraint(["org"], ["orgs.path"], name="fk_teams_org_orgs", ondelete="CASCADE"),
    )
    op.create_index("ix_teams_org", "teams", ["org"])
    op.create_table(
        "projects",
        sa.Column("path", sa.String(200), nullable=False),
        sa.Column("team", sa.String(130), nullable=False),
        _timestamp("created_at"),
        sa.PrimaryKeyConstraint("path", name="pk_projects"),
        sa.ForeignKeyConstraint(["team"], ["teams.path"], name="fk_projects_team_teams", ondelete="CASCADE"),
    )
    op.create_index("ix_projects_team", "projects", ["team"])
    op.create_table(
        "users",
        sa.Column("name", sa.String(64), nullable=False),
        _timestamp("created_at"),
        sa.PrimaryKeyConstraint("name", name="pk_users"),
    )
    op.create_table(
        "role_bindings",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True
        ),
        sa.Column("user_name", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("scope_kind", sa.String(16), nullable=False),
        sa.Column("scope_path", sa.String(200), nullable=False),
        _timestamp("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_role_bindings"),
        sa.ForeignKeyConstraint(
            ["user_name"], ["users.name"], name="fk_role_bindings_user_name_users", ondelete="CASCADE"
        ),
        sa.UniqueConstraint(
            "user_name", "scope_kind", "scope_path", name="uq_role_bindings_user_name_scope_kind_scope_path"
        ),
    )
    op.create_index("ix_role_bindings_user_name", "role_bindings", ["user_name"])
    op.create_table(
        "user_tokens",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("user_name", sa.String(64), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        _timestamp("created_at"),
        _timestamp("expires_at", nullable=True),
        _timestamp("revoked_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_user_tokens"),
        sa.ForeignKeyConstraint(
            ["user_name"], ["users.name"], name="fk_user_tokens_user_name_users", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_user_tokens_user_name", "user_tokens", ["user_name"])
    op.create_index("ix_user_tokens_secret_hash", "user_tokens", ["secret_hash"], unique=True)

    op.add_column("models", sa.Column("owner_kind", sa.String(16), nullable=False, server_default="cluster"))
    op.add_column("models", sa.Column("owner_path", sa.String(200), nullable=False, server_default=""))
    op.create_index("ix_models_owner", "models", ["owner_kind", "owner_path"])
    op.add_column(
        "api_keys", sa.Column("place_kind", sa.String(16), nullable=False, server_default="cluster")
    )
    op.add_column("api_keys", sa.Column("place_path", sa.String(200), nullable=False, server_default=""))
    _structure_model_owners()


def _structure_model_owners() -> None:
    models = sa.table(
        "models",
        sa.column("name", sa.String()),
        sa.column("definition", sa.JSON()),
        sa.column("owner_kind", sa.String()),
        sa.column("owner_path", sa.String()),
    )
    bind = op.get_bind()
    for name, definition in bind.execute(sa.select(models.c.name, models.c.definition)).all():
        if not isinstance(definition, dict):
            continue
        try:
            owner = Owner.parse(str(definition.get("owner") or ""))
        except ValueError:
            owner = CLUSTER
        values: dict[str, object] = {"owner_kind": owner.kind.value, "owner_path": owner.path}
        if definition.get("owner", "") != str(owner):
            values["definition"] = {**definition, "owner": str(owner)}
        bind.execute(sa.update(models).where(models.c.name == name).values(**values))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("place_path")
        batch.drop_column("place_kind")
    op.drop_index("ix_models_owner", table_name="models")
    with op.batch_alter_table("models") as batch:
        batch.drop_column("owner_path")
        batch.drop_column("owner_kind")
    op.drop_table("user_tokens")
    op.drop_table("role_bindings")
    op.drop_table("users")
    op.drop_table("projects")
    op.drop_table("teams")
    op.drop_table("orgs")
