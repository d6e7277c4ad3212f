"""Usage you can read: each row keeps its key's place (and the place's team and organization) as it
was when the requests were made, and the timings behind time to first token and tokens per second.

Rows written before keep the place their key has now (keys made before
tenancy sit nowhere: their rows count under no project), and no timings.

Revision ID: 0005
Revises: 0004
Created: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from llmgw.core.tenancy import Owner, OwnerKind

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PLACES = (("place", 200), ("team", 140), ("org", 70))
TIMINGS = (("streamed", sa.Integer()), ("ttft_ms", sa.BigInteger()), ("generation_ms", sa.BigInteger()))


def upgrade() -> None:
    with op.batch_alter_table("usage") as batch:
        for name, size in PLACES:
            batch.add_column(sa.Column(name, sa.String(size), nullable=False, server_default=""))
        for name, kind in TIMINGS:
            batch.add_column(sa.Column(name, kind, nullable=False, server_default="0"))
    for name, _ in PLACES:
        op.create_index(f"ix_usage_{name}", "usage", [name])
    _place_old_rows()


def _place_old_rows() -> None:
    """Rows of keys that sit somewhere take the key's place (the only one known for them)."""
    connection = op.get_bind()
    keys = sa.table("api_keys", sa.column("id"), sa.column("place_kind"), sa.column("place_path"))
    usage = sa.table("usage", sa.column("key_id"), *(sa.column(name) for name, _ in PLACES))
    for key_id, kind, path in connection.execute(
        sa.select(keys.c.id, keys.c.place_kind, keys.c.place_path).where(keys.c.place_kind != "cluster")
    ):
        place = Owner(OwnerKind(kind), path)
        chain = {owner.kind: str(owner) for owner in place.lineage()}
        connection.execute(
            usage.update()
            .where(usage.c.key_id == key_id)
            .values(place=str(place), team=chain.get(OwnerKind.TEAM, ""), org=chain.get(OwnerKind.ORG, ""))
        )


def downgrade() -> None:
    for name, _ in PLACES:
        op.drop_index(f"ix_usage_{name}", table_name="usage")
    with op.batch_alter_table("usage") as batch:
        for name, _ in (*TIMINGS, *PLACES):
            batch.drop_column(name)
