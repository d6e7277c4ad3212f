"""Knowledge collections: collections, documents, passages (text, offsets, vector) and pairs.

On SQLite a full-text index of the passages (FTS5 with the porter stemmer,
``knowledge_fts``: rowid is the passage's id) is created too; PostgreSQL keeps none (the control plane's
in-memory BM25 serves keyword search there, docs/knowledge.md).

Revision ID: 0011
Revises: 0010
Created: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SERIAL = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _id() -> sa.Column[int]:
    return sa.Column("id", _SERIAL, primary_key=True, autoincrement=True)


def _collection(table: str) -> sa.Column[int]:
    return sa.Column(
        "collection_id",
        _SERIAL,
        sa.ForeignKey(
            "knowledge_collections.id",
            ondelete="CASCADE",
            name=f"fk_{table}_collection_id_knowledge_collections",
        ),
        nullable=False,
    )


def upgrade() -> None:
    op.create_table(
        "knowledge_collections",
        _id(),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("owner_kind", sa.String(16), nullable=False),
        sa.Column("owner_path", sa.String(200), nullable=False),
        sa.Column("embedding_model", sa.String(256), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_knowledge_collections"),
        sa.UniqueConstraint("name", name="uq_knowledge_collections_name"),
    )
    for table, columns in (
        (
            "knowledge_documents",
            [
                sa.Column("name", sa.String(512), nullable=False),
                sa.Column("kind", sa.String(16), nullable=False),
                sa.Column("size", sa.BigInteger(), nullable=False),
                sa.Column("sha256", sa.String(64), nullable=False),
                sa.Column("passages", sa.Integer(), nullable=False),
                sa.Column("uploaded_by", sa.String(128), nullable=False),
                sa.Column("uploaded_at", sa.DateTime(timezone=True), nullable=False),
                sa.UniqueConstraint(
                    "collection_id", "name", name="uq_knowledge_documents_collection_id_name"
                ),
            ],
        ),
        (
            "knowledge_pairs",
            [
                sa.Column("question", sa.String(), nullable=False),
                sa.Column("answer", sa.String(), nullable=False),
            ],
        ),
    ):
        op.create_table(
            table, _id(), _collection(table), *columns, sa.PrimaryKeyConstraint("id", name=f"pk_{table}")
        )
    op.create_index("ix_knowledge_pairs_collection_id", "knowledge_pairs", ["collection_id"])
    op.create_table(
        "knowledge_passages",
        _id(),
        _collection("knowledge_passages"),
        sa.Column(
            "document_id",
            _SERIAL,
            sa.ForeignKey(
                "knowledge_documents.id",
                ondelete="CASCADE",
                name="fk_knowledge_passages_document_id_knowledge_documents",
            ),
            nullable=False,
        ),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("text", sa.String(), nullable=False),
        sa.Column("start", sa.Integer(), nullable=False),
        sa.Column("end", sa.Integer(), nullable=False),
        sa.Column("vector", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_knowledge_passages"),
    )
    op.create_index("ix_knowledge_passages_collection_id", "knowledge_passages", ["collection_id"])
    op.create_index("ix_knowledge_passages_document_id", "knowledge_passages", ["document_id"])
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            "CREATE VIRTUAL TABLE knowledge_fts "
            "USING fts5(text, collection_id UNINDEXED, tokenize='porter unicode61')"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("DROP TABLE knowledge_fts")
    op.drop_table("knowledge_passages")
    op.drop_table("knowledge_pairs")
    op.drop_table("knowledge_documents")
    op.drop_table("knowledge_collections")
