"""Training jobs on an agent's stream: the job a node is told to run, its reports, and its results.

The control plane sends :class:`StartTraining` to the node it placed a job
on (again after a reconnect while the job is unfinished: the agent answers
with the job's status and never runs one attempt twice) and
:class:`CancelTraining` to stop it. The agent reports :class:`TrainingStatus`
as the job goes (state, step of how many, loss, peak memory, new log lines)
and, once it is ``FINISHED``, the files it made. The control plane then
pulls each file a piece at a time (:class:`TrainingFetch` answered by
:class:`TrainingPiece`), resuming from what it holds after a reconnect or a
failover, checks each file's sha256, and sends :class:`TrainingCollected`:
the node may then remove its copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

MAX_PAIRS_BYTES = 2 * 1024 * 1024
"""The question/answer pairs travel inside :class:`StartTraining`; a job's pairs are at most this."""

MAX_PIECE_BYTES = 1024 * 1024
"""One :class:`TrainingPiece` carries at most this much of a file."""


class TrainingState(StrEnum):
    """Where a job stands on its node."""

    PREPARING = "preparing"
    """Installing the training environment, fetching the base model's files."""
    TRAINING = "training"
    CONVERTING = "converting"
    """Making the GGUF adapter with llama.cpp's own conversion."""
    FINISHED = "finished"
    """The results are on the node, named in ``results``: the control plane pulls them."""
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class TrainingFile:
    """A file by its sha256: a base-model file in the mirror, or a result on the node."""

    sha256: str
    filename: str
    size: int


@dataclass(frozen=True)
class StartTraining:
    """Train a LoRA adapter for ``model`` on ``device`` from ``pairs``."""

    job_id: str
    attempt: int
    model: str
    """The catalog model the adapter is for."""
    weights: tuple[TrainingFile, ...]
    """The base model's files in the mirror: ``*.safetensors``, ``config.json``, tokenizer files."""
    device: str
    """``cpu``, or a card as placement names it (``0``, ``1/mig0``)."""
    memory_mb: int
    pairs: bytes
    """JSON lines, one ``{"question": ..., "answer": ...}`` each; at most :data:`MAX_PAIRS_BYTES`."""
    options: str = "{}"
    """JSON: rank, alpha, dropout, target_modules, steps, learning_rate, seed, max_length."""
    gguf: bool = False
    """Also make a GGUF adapter (the model is served by llama.cpp)."""


@dataclass(frozen=True)
class CancelTraining:
    job_id: str
    reason: str = ""


@dataclass(frozen=True)
class TrainingFetch:
    """Send ``length`` bytes of a finished job's file from ``offset``."""

    job_id: str
    filename: str
    offset: int
    length: int = MAX_PIECE_BYTES


@dataclass(frozen=True)
class TrainingCollected:
    """The control plane holds every result of the job: the node may remove its copy."""

    job_id: str


@dataclass(frozen=True)
class TrainingStatus:
    """A job's progress on its node, sent on each change and again after every registration."""

    job_id: str
    attempt: int
    state: TrainingState
    step: int = 0
    steps: int = 0
    loss: float = 0.0
    peak_memory_bytes: int = 0
    error: str = ""
    """Why it failed, and what to do."""
    results: tuple[TrainingFile, ...] = ()
    """With ``FINISHED``: the files made."""
    log_lines: tuple[str, ...] = field(default=())
    """Lines of the trainer's output since the last status."""
    detail: str = ""
    """What it is doing now (``fetching weights 40 %``)."""


@dataclass(frozen=True)
class TrainingPiece:
    """The answer to :class:`TrainingFetch`: bytes of the file from ``offset`` (empty at its end)."""

    job_id: str
    filename: str
    offset: int
    data: bytes = b""
    error: str = ""
    """The file is not there (no such job or file on this node)."""
