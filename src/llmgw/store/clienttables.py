"""The tables of what clients make: batches, kept responses, files, ComfyUI jobs.

Written through the client store (no fence: any process that answers a client
writes them, ``controlplane/serving/clientstore.py``); declared on the same
:class:`~llmgw.store.tables.Base` as the cluster's tables, whose rules they
follow.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from llmgw.store.tables import Base, UTCDateTime


class BatchRow(Base):
    """A batch of ``/v1`` requests (OpenAI's Batch API): its ask, status, counts and files."""

    __tablename__ = "batches"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    owner: Mapped[str] = mapped_column(String(256), nullable=False, index=True)
    """Where the key that made it sits: every key there sees it."""
    key_id: Mapped[str] = mapped_column(String(64), nullable=False)
    """The key its requests are sent as (limits and usage count under it)."""
    endpoint: Mapped[str] = mapped_column(String(64), nullable=False)
    input_file_id: Mapped[str] = mapped_column(String(64), nullable=False)
    completion_window: Mapped[str] = mapped_column(String(8), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False, index=True)
    meta: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON, nullable=True)
    total: Mapped[int] = mapped_column(Integer, nullable=False)
    completed: Mapped[int] = mapped_column(Integer, nullable=False)
    failed: Mapped[int] = mapped_column(Integer, nullable=False)
    input_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False)
    output_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False)
    output_file_id: Mapped[str] = mapped_column(String(64), nullable=False)
    error_file_id: Mapped[str] = mapped_column(String(64), nullable=False)
    errors: Mapped[list[dict[str, Any]]] = mapped_column(JSON, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    times: Mapped[dict[str, float]] = mapped_column(JSON, nullable=False)
    """When it reached each status after ``validating`` (Unix seconds by status name)."""
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class BatchRequestRow(Base):
    """One request of a batch: its line of the input, and once answered, its line of the output."""

    __tablename__ = "batch_requests"
    __table_args__ = (UniqueConstraint("batch_id", "custom_id"),)

    batch_id: Mapped[str] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    custom_id: Mapped[str] = mapped_column(String(512), nullable=False)
    body: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    state: Mapped[str] = mapped_column(String(12), nullable=False)
    """``pending``, ``done`` (a 2xx answer) or ``failed`` (any other, or never sent)."""
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """Its line of the output or error file, once answered."""


class KeptResponseRow(Base):
    """A response kept for ``previous_response_id`` and ``/v1/responses/{id}``, readable by its key."""

    __tablename__ = "kept_responses"
    __table_args__ = (Index("ix_kept_responses_key_id_kept_at", "key_id", "kept_at"),)

    response_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(64), nullable=False)
    """The key that made it: no other key reads or deletes it."""
    input_items: Mapped[list[dict[str, Any]]] = mapped_column(JSON, nullable=False)
    """The conversation it was answered on: its history and its own input."""
    output_items: Mapped[list[dict[str, Any]]] = mapped_column(JSON, nullable=False)
    response: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    """The response object as it was answered."""
    kept_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False, index=True)


class ClientFileRow(Base):
    """A file a client uploaded to ``/v1/files`` (or a batch wrote): its name, purpose and blob."""

    __tablename__ = "client_files"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    owner: Mapped[str] = mapped_column(String(256), nullable=False, index=True)
    """Where the key that made it sits: every key there reads it."""
    key_id: Mapped[str] = mapped_column(String(64), nullable=False)
    purpose: Mapped[str] = mapped_column(String(32), nullable=False)
    filename: Mapped[str] = mapped_column(String(512), nullable=False)
    size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    sha256: Mapped[str] = mapped_column(String(64), nullable=False, index=True)
    """The mirror's blob holding its bytes."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True, index=True)


class WorkflowJobRow(Base):
    """A ComfyUI job (``POST /v1/jobs``): its ask, where it runs, its progress and what it made."""

    __tablename__ = "workflow_jobs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(64), nullable=False, index=True)
    """The key that made it: only that key reads or cancels it."""
    owner: Mapped[str] = mapped_column(String(256), nullable=False)
    """Where that key sits (its files belong there)."""
    model: Mapped[str] = mapped_column(String(256), nullable=False)
    served_by: Mapped[str] = mapped_column(String(256), nullable=False)
    graph: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    state: Mapped[str] = mapped_column(String(12), nullable=False, index=True)
    progress: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    """ahead, node, step, steps, percent, error, status (what ``GET /v1/jobs/{id}`` shows)."""
    files: Mapped[list[dict[str, Any]]] = mapped_column(JSON, nullable=False)
    replica_id: Mapped[str] = mapped_column(String(128), nullable=False)
    prompt_id: Mapped[str] = mapped_column(String(128), nullable=False)
    """ComfyUI's id of the queued workflow, once queued: how a new runner follows it on the gate."""
    runner: Mapped[str] = mapped_column(String(256), nullable=False)
    """The process following it (``plane/worker/pid``)."""
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    """When its runner last wrote it: one silent too long is taken over by the leader."""
    cancel_asked: Mapped[bool] = mapped_column(Boolean, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True, index=True)
