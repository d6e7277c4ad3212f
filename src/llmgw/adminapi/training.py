"""The admin API's shapes for training jobs: what ``/api/training/jobs`` takes and answers."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, JsonValue

from llmgw.adminapi.schemas import AnswerModel, RequestModel
from llmgw.core.filenames import safe_filename
from llmgw.core.tenancy import owner_text
from llmgw.core.training import ANY_NODE, MAX_RETRY
from llmgw.core.trainingstream import MAX_PAIRS_BYTES


class BaseFile(RequestModel):
    sha256: str = Field(pattern=r"^(sha256:)?[0-9a-f]{64}$")
    filename: Annotated[str, AfterValidator(safe_filename)]
    """The file's name on the node (no path, no control characters, at most 255 bytes)."""


class TrainingSubmit(RequestModel):
    """A job to submit: the model, the pairs (or the collections they come from), where and how."""

    model: str = Field(min_length=1, max_length=128)
    """The catalog model the adapter is for."""
    pairs: str = Field(default="", max_length=MAX_PAIRS_BYTES)
    """JSON lines, one ``{"question": ..., "answer": ...}`` each."""
    pairs_from: list[str] = Field(default_factory=list, max_length=64)
    """Knowledge collections to take the pairs from, instead of ``pairs``."""
    weights: list[BaseFile] = Field(default_factory=list, max_length=256)
    """The base model's safetensors, config and tokenizer files in the mirror; empty: the model's own."""
    node: str = Field(default=ANY_NODE, min_length=1, max_length=128)
    memory_mb: int = Field(ge=1, le=10_000_000)
    """The memory it needs on its card (or, on the CPU, of the host)."""
    device: Literal["card", "cpu"] = "card"
    options: dict[str, JsonValue] = Field(default_factory=dict)
    """rank, alpha, dropout, target_modules, steps, learning_rate, seed, max_length."""
    gguf: bool | None = None
    """Also make a GGUF adapter; None: when the model is served by llama.cpp."""
    retry: int = Field(default=0, ge=0, le=MAX_RETRY)
    """Times it is placed again when its node goes away mid-job."""
    owner: Annotated[str, AfterValidator(owner_text)] | None = None
    """Who owns the job and its adapter; None: the collections' owner, else the caller or the model's."""


class TrainingPublish(RequestModel):
    name: str = Field(min_length=1, max_length=128)
    """The adapter's name, as clients ask for it."""
    owner: Annotated[str, AfterValidator(owner_text)] | None = None
    """Who owns the adapter; None: the job's owner."""


class TrainingResult(AnswerModel):
    sha256: str
    filename: str
    size: int
    collected: int = 0


class TrainingJobView(AnswerModel):
    """One job: where it stands, how far it got, what it made."""

    id: str
    owner: str
    model: str
    state: str
    node: str
    """The node asked for, or ``any``."""
    node_id: str = ""
    device: str = ""
    device_kind: str = "card"
    memory_mb: int
    attempt: int = 0
    retry: int = 0
    step: int = 0
    steps: int = 0
    loss: float = 0.0
    losses: list[tuple[int, float]] = Field(default_factory=list)
    peak_memory_bytes: int = 0
    detail: str = ""
    reasons: str = ""
    """Why it is queued: each node's refusal."""
    error: str = ""
    gguf: bool = False
    options: dict[str, Any] = Field(default_factory=dict)
    collections: list[str] = Field(default_factory=list)
    results: list[TrainingResult] = Field(default_factory=list)
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None = None


class TrainingLogs(AnswerModel):
    id: str
    lines: list[str]


class PublishedAdapter(AnswerModel):
    model: str
    name: str
    owner: str
    sha256: str
    filename: str
