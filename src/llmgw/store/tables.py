"""The store's tables: SQLAlchemy declarative classes, portable between SQLite and PostgreSQL.

These rows never leave the store: repositories turn them into frozen records.
The schema itself is created by the Alembic migrations in ``migrations/versions``
(hand-written); a test checks that the migrations and these classes agree.

Portability rules kept here: JSON columns (``json`` on PostgreSQL, text on
SQLite), timestamps always aware and in UTC (:class:`UTCDateTime`), auto-numbered
ids that are ``INTEGER PRIMARY KEY`` on SQLite and ``BIGSERIAL`` on PostgreSQL,
and constraint names fixed by :data:`NAMING` so migrations can refer to them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import CursorResult, Result
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
"""Constraint and index names, the same on every database."""

SerialId = BigInteger().with_variant(Integer(), "sqlite")
"""An auto-numbered primary key: SQLite numbers only ``INTEGER PRIMARY KEY`` columns."""


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and read back aware, also on SQLite (which keeps no zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("timestamps given to the store must carry a time zone")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class ModelRow(Base):
    """One model of the catalog; ``definition`` is its definition as a plain dict."""

    __tablename__ = "models"

    __table_args__ = (Index("ix_models_owner", "owner_kind", "owner_path"),)

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    definition: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    owner_kind: Mapped[str] = mapped_column(String(16), nullable=False, server_default="cluster")
    """The definition's owner, kept apart to find what an owner owns (:class:`llmgw.core.tenancy.Owner`)."""
    owner_path: Mapped[str] = mapped_column(String(200), nullable=False, server_default="")


class ReplicaRow(Base):
    """A replica the reconciler decided on: which model, on which node and devices."""

    __tablename__ = "replicas"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(
        String(128), ForeignKey("models.name", ondelete="CASCADE"), nullable=False, index=True
    )
    node_id: Mapped[str] = mapped_column(String(128), nullable=False, index=True)
    api_key: Mapped[str] = mapped_column(String(128), nullable=False)
    devices: Mapped[list[int]] = mapped_column(JSON, nullable=False)
    memory_mb: Mapped[int] = mapped_column(Integer, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    profile: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    """The index of the model's profile the replica runs (placement tries them in order)."""


class NodeRow(Base):
    """A node that has registered at least once, with its last reported inventory."""

    __tablename__ = "nodes"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    address: Mapped[str] = mapped_column(String(512), nullable=False)
    inventory: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class ApiKeyRow(Base):
    """A client API key; only the sha256 of its secret is kept."""

    __tablename__ = "api_keys"
    __table_args__ = (
        Index(
            "uq_api_keys_active_name",
            "name",
            unique=True,
            sqlite_where=text("revoked_at IS NULL"),
            postgresql_where=text("revoked_at IS NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), nullable=False)
    prefix: Mapped[str] = mapped_column(String(16), nullable=False)
    secret_hash: Mapped[str] = mapped_column(String(64), nullable=False, unique=True, index=True)
    owner: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    """A label: who uses the key. What it sees follows its place."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    place_kind: Mapped[str] = mapped_column(String(16), nullable=False, server_default="cluster")
    """Where the key sits: ``project`` or ``user`` (``cluster``: nowhere, public models only)."""
    place_path: Mapped[str] = mapped_column(String(200), nullable=False, server_default="")
    collections: Mapped[list[str]] = mapped_column(JSON, nullable=False, server_default="[]")
    """Knowledge collections the key's chat and Responses requests search when they name none."""


class OrgRow(Base):
    """An organization: it holds teams. ``path`` is its name."""

    __tablename__ = "orgs"

    path: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class TeamRow(Base):
    """A team of an organization: it holds projects. ``path`` is ``org/team``."""

    __tablename__ = "teams"

    path: Mapped[str] = mapped_column(String(130), primary_key=True)
    org: Mapped[str] = mapped_column(
        String(64), ForeignKey("orgs.path", ondelete="CASCADE"), nullable=False, index=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class ProjectRow(Base):
    """A project of a team: keys live here. ``path`` is ``org/team/project``."""

    __tablename__ = "projects"

    path: Mapped[str] = mapped_column(String(200), primary_key=True)
    team: Mapped[str] = mapped_column(
        String(130), ForeignKey("teams.path", ondelete="CASCADE"), nullable=False, index=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class UserRow(Base):
    """A person who calls ``/api`` with tokens of their own."""

    __tablename__ = "users"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class RoleBindingRow(Base):
    """A user's role at the cluster, an organization or a team; one role per user and scope."""

    __tablename__ = "role_bindings"
    __table_args__ = (UniqueConstraint("user_name", "scope_kind", "scope_path"),)

    id: Mapped[int] = mapped_column(SerialId, primary_key=True, autoincrement=True)
    user_name: Mapped[str] = mapped_column(
        String(64), ForeignKey("users.name", ondelete="CASCADE"), nullable=False, index=True
    )
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    scope_kind: Mapped[str] = mapped_column(String(16), nullable=False)
    scope_path: Mapped[str] = mapped_column(String(200), nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class UserTokenRow(Base):
    """A user's token for ``/api``; only the sha256 of its secret is kept."""

    __tablename__ = "user_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user_name: Mapped[str] = mapped_column(
        String(64), ForeignKey("users.name", ondelete="CASCADE"), nullable=False, index=True
    )
    name: Mapped[str] = mapped_column(String(128), nullable=False)
    prefix: Mapped[str] = mapped_column(String(16), nullable=False)
    secret_hash: Mapped[str] = mapped_column(String(64), nullable=False, unique=True, index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class SettingRow(Base):
    """The current value of one runtime setting."""

    __tablename__ = "settings"

    key: Mapped[str] = mapped_column(String(256), primary_key=True)
    value: Mapped[Any] = mapped_column(JSON, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class SettingChangeRow(Base):
    """One change of a setting; ``value`` is SQL NULL when the setting was deleted."""

    __tablename__ = "settings_history"

    id: Mapped[int] = mapped_column(SerialId, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(256), nullable=False, index=True)
    value: Mapped[Any] = mapped_column(JSON, nullable=True)
    changed_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    actor: Mapped[str] = mapped_column(String(256), nullable=False)


class AuditRow(Base):
    """One administrative action: who did what to which thing."""

    __tablename__ = "audit"

    id: Mapped[int] = mapped_column(SerialId, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, index=True)
    actor: Mapped[str] = mapped_column(String(256), nullable=False)
    action: Mapped[str] = mapped_column(String(128), nullable=False)
    target: Mapped[str] = mapped_column(String(512), nullable=False)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)


class UsageRow(Base):
    """What one key used of one model over one stretch of time (the writer's flush interval)."""

    __tablename__ = "usage"

    id: Mapped[int] = mapped_column(SerialId, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, index=True)
    key_id: Mapped[str] = mapped_column(String(32), nullable=False, index=True)
    model: Mapped[str] = mapped_column(String(128), nullable=False)
    requests: Mapped[int] = mapped_column(Integer, nullable=False)
    failed: Mapped[int] = mapped_column(Integer, nullable=False)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False)
    duration_ms: Mapped[int] = mapped_column(BigInteger, nullable=False)
    place: Mapped[str] = mapped_column(String(200), nullable=False, server_default="", index=True)
    """Where the key sat when the requests were made (``project:…``, ``user:…``; empty: nowhere)."""
    team: Mapped[str] = mapped_column(String(140), nullable=False, server_default="", index=True)
    """The place's team then (``team:ORG/TEAM``; empty for a user's key or none)."""
    org: Mapped[str] = mapped_column(String(70), nullable=False, server_default="", index=True)
    """The place's organization then (``org:ORG``; empty for a user's key or none)."""
    streamed: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    """Requests whose time to first token was measured (streamed answers)."""
    ttft_ms: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    """Times to first token of the streamed requests, summed."""
    generation_ms: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    """Time spent generating the completion tokens, summed (tokens per second = tokens / this)."""
    refused: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    """The status the row's requests were refused with before any replica took them (0: one did)."""
    cached_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    """Prompt tokens the engine found in its cache (counted in ``prompt_tokens`` too)."""
    cost: Mapped[float] = mapped_column(Float, nullable=False, server_default="0")
    """What the requests cost at the prices in force when they ended, in the cluster's currency."""


class LimitRow(Base):
    """The limits set on one subject: ``key:ID`` or an owner's text (:mod:`llmgw.core.limits`)."""

    __tablename__ = "limits"

    subject: Mapped[str] = mapped_column(String(256), primary_key=True)
    limits: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    """:meth:`llmgw.core.limits.Limits.as_dict`."""
    changed_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class LimitCountRow(Base):
    """Tokens a subject spent in one UTC day (``day:2026-11-30``) or month (``month:2026-11``)."""

    __tablename__ = "limit_counts"

    subject: Mapped[str] = mapped_column(String(256), primary_key=True)
    period: Mapped[str] = mapped_column(String(16), primary_key=True)
    used: Mapped[int] = mapped_column(BigInteger, nullable=False)


class BlobRow(Base):
    """A file the mirror keeps, by the sha256 of its bytes."""

    __tablename__ = "blobs"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    filename: Mapped[str] = mapped_column(String(512), nullable=False)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    owner: Mapped[str] = mapped_column(String(128), nullable=False, server_default="", index=True)
    """The user who uploaded it through ``/api`` (counted against ``mirror.quota_bytes``); empty: the
    cluster's (imported on a control plane, pulled, published, a client's file)."""


class BlobCopyRow(Base):
    """A control plane that holds a blob's bytes in its own mirror folder, and since when."""

    __tablename__ = "blob_copies"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    plane: Mapped[str] = mapped_column(String(128), primary_key=True)
    """The control plane's name."""
    address: Mapped[str] = mapped_column(String(512), nullable=False)
    """host:port of its agent server, where peers and nodes fetch the blob."""
    copied_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class LeadershipRow(Base):
    """The leader lease: one row (id 1); times are seconds on the database's own clock."""

    __tablename__ = "leadership"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    holder: Mapped[str] = mapped_column(String(128), nullable=False)
    epoch: Mapped[int] = mapped_column(BigInteger, nullable=False)
    """Grows by one every time the lease changes hands; writes of an older epoch are refused."""
    expires_s: Mapped[float] = mapped_column(Float, nullable=False)


class ControlPlaneRow(Base):
    """A control plane the store knows, with where agents and clients reach it."""

    __tablename__ = "control_planes"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    agent_address: Mapped[str] = mapped_column(String(512), nullable=False)
    http_address: Mapped[str] = mapped_column(String(512), nullable=False)
    seen_s: Mapped[float] = mapped_column(Float, nullable=False)


class TrainingJobRow(Base):
    """A training job (:mod:`llmgw.store.training`): what it trains on, where it runs, how far it got."""

    __tablename__ = "training_jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner: Mapped[str] = mapped_column(String(256), nullable=False)
    model: Mapped[str] = mapped_column(String(128), nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False, index=True)
    node: Mapped[str] = mapped_column(String(128), nullable=False)
    """The node asked for, or ``any``."""
    node_id: Mapped[str] = mapped_column(String(128), nullable=False)
    """The node it is placed on (empty: none yet)."""
    device: Mapped[str] = mapped_column(String(32), nullable=False)
    memory_mb: Mapped[int] = mapped_column(Integer, nullable=False)
    attempt: Mapped[int] = mapped_column(Integer, nullable=False)
    retry: Mapped[int] = mapped_column(Integer, nullable=False)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    """device kind, weights, options, gguf, the collections the pairs came from, who submitted it."""
    pairs: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    progress: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    logs: Mapped[list[str]] = mapped_column(JSON, nullable=False)
    results: Mapped[list[dict[str, Any]]] = mapped_column(JSON, nullable=False)
    reasons: Mapped[str] = mapped_column(Text, nullable=False)
    error: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class KnowledgeCollectionRow(Base):
    """A knowledge collection: its owner, the embedding model its passages were embedded with."""

    __tablename__ = "knowledge_collections"

    id: Mapped[int] = mapped_column(SerialId, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), nullable=False, unique=True)
    owner_kind: Mapped[str] = mapped_column(String(16), nullable=False)
    owner_path: Mapped[str] = mapped_column(String(200), nullable=False)
    embedding_model: Mapped[str] = mapped_column(String(256), nullable=False)
    created_by: Mapped[str] = mapped_column(String(128), nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    revision: Mapped[int] = mapped_column(BigInteger, nullable=False)
    """Grows by one with every document added or removed: in-memory indexes rebuild on a change."""


class KnowledgeDocumentRow(Base):
    """A document of a collection; written with all its passages in one transaction."""

    __tablename__ = "knowledge_documents"
    __table_args__ = (UniqueConstraint("collection_id", "name"),)

    id: Mapped[int] = mapped_column(SerialId, primary_key=True, autoincrement=True)
    collection_id: Mapped[int] = mapped_column(
        ForeignKey("knowledge_collections.id", ondelete="CASCADE"), nullable=False
    )
    name: Mapped[str] = mapped_column(String(512), nullable=False)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    passages: Mapped[int] = mapped_column(Integer, nullable=False)
    uploaded_by: Mapped[str] = mapped_column(String(128), nullable=False)
    uploaded_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class KnowledgePassageRow(Base):
    """One passage of a document: its text, where it sits, and its vector (float32, little-endian)."""

    __tablename__ = "knowledge_passages"

    id: Mapped[int] = mapped_column(SerialId, primary_key=True, autoincrement=True)
    collection_id: Mapped[int] = mapped_column(
        ForeignKey("knowledge_collections.id", ondelete="CASCADE"), nullable=False, index=True
    )
    document_id: Mapped[int] = mapped_column(
        ForeignKey("knowledge_documents.id", ondelete="CASCADE"), nullable=False, index=True
    )
    position: Mapped[int] = mapped_column(Integer, nullable=False)
    text: Mapped[str] = mapped_column(String, nullable=False)
    start: Mapped[int] = mapped_column(Integer, nullable=False)
    end: Mapped[int] = mapped_column(Integer, nullable=False)
    vector: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


class KnowledgePairRow(Base):
    """A question/answer pair of a collection, for training (never made public)."""

    __tablename__ = "knowledge_pairs"

    id: Mapped[int] = mapped_column(SerialId, primary_key=True, autoincrement=True)
    collection_id: Mapped[int] = mapped_column(
        ForeignKey("knowledge_collections.id", ondelete="CASCADE"), nullable=False, index=True
    )
    question: Mapped[str] = mapped_column(String, nullable=False)
    answer: Mapped[str] = mapped_column(String, nullable=False)


def rowcount(result: Result[Any]) -> int:
    """How many rows an ``UPDATE`` or ``DELETE`` touched."""
    return result.rowcount if isinstance(result, CursorResult) else 0


class ReplicaDrainRow(Base):
    """A replica the leader is draining (no new requests), kept so that a new leader drains it on."""

    __tablename__ = "replica_drains"

    replica_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("replicas.id", ondelete="CASCADE"), primary_key=True
    )
    since: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    """When the drain began: its timeout counts from then, whichever control plane leads."""
    reason: Mapped[str] = mapped_column(Text, nullable=False)


class RollSurgeRow(Base):
    """The replica an adapter roll placed beyond its model's count, until an old one drains in its place."""

    __tablename__ = "roll_surges"

    model: Mapped[str] = mapped_column(
        String(128), ForeignKey("models.name", ondelete="CASCADE"), primary_key=True
    )
    replica_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("replicas.id", ondelete="CASCADE"), nullable=False
    )


class AgentRolloutRow(Base):
    """The last rollout of a release over the agents (one row, id 1): where it stands, or why it stopped."""

    __tablename__ = "agent_rollout"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[str] = mapped_column(String(64), nullable=False)
    sums: Mapped[str] = mapped_column(Text, nullable=False)
    """The release's SHA256SUMS: a new leader checks it again against its own trusted key."""
    signature: Mapped[str] = mapped_column(Text, nullable=False)
    nodes: Mapped[list[str]] = mapped_column(JSON, nullable=False)
    """The nodes to upgrade, in order."""
    upgraded: Mapped[list[str]] = mapped_column(JSON, nullable=False)
    current: Mapped[str] = mapped_column(String(128), nullable=False)
    """The node upgrading now ("" between nodes and once finished)."""
    current_since: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    """When the current node was sent the release: its timeout counts from then."""
    error: Mapped[str] = mapped_column(Text, nullable=False)
    finished: Mapped[bool] = mapped_column(Boolean, nullable=False)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class StoreSecretRow(Base):
    """What the store keeps about its sealed secrets: a value sealed with the cluster's store key, which
    a control plane opens at start to know it holds that key (:mod:`llmgw.store.secretcheck`)."""

    __tablename__ = "store_secrets"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text, nullable=False)
