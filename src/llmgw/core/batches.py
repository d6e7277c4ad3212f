"""OpenAI's Batch API, the rules: a batch's statuses, its input file's lines, its output's lines.

A batch is a JSONL file of requests (one ``/v1`` endpoint for all) that llmgw
answers on the capacity interactive traffic leaves free, within its
``completion_window``. Its status moves only forward::

    validating ─▶ in_progress ─▶ finalizing ─▶ completed
        │              │  │
        ▼              │  └─▶ (window passed) ─▶ finalizing ─▶ expired
      failed           └─▶ cancelling ─▶ cancelled

Every request line is answered once: its result (one line of the output
file, or of the error file when it failed) is kept as it comes, so a batch
taken over by another leader keeps what it had and runs only the rest.

Pure: no I/O; the store keeps batches (``store/batches.py``), the control
plane runs them (``controlplane/serving/batching.py``).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class BatchStatus(StrEnum):
    """A batch's status, as OpenAI names them."""

    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        return self in ENDED


ENDED = frozenset({BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED})

NEXT: dict[BatchStatus, frozenset[BatchStatus]] = {
    BatchStatus.VALIDATING: frozenset({BatchStatus.IN_PROGRESS, BatchStatus.FAILED, BatchStatus.CANCELLING}),
    BatchStatus.IN_PROGRESS: frozenset({BatchStatus.FINALIZING, BatchStatus.CANCELLING}),
    BatchStatus.FINALIZING: frozenset({BatchStatus.COMPLETED, BatchStatus.EXPIRED}),
    BatchStatus.CANCELLING: frozenset({BatchStatus.CANCELLED}),
}
"""The statuses each status may move to (an ended one moves no more)."""


def may_move(status: BatchStatus, to: BatchStatus) -> bool:
    return to in NEXT.get(status, frozenset())


ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings", "/v1/responses")
"""The endpoints a batch's requests may go to."""

COMPLETION_WINDOWS = {"24h": 24 * 3600}
"""``completion_window`` values and their seconds (OpenAI takes only ``24h``)."""

MAX_REQUESTS = 50_000
"""Most request lines in one batch (OpenAI's bound too)."""

METADATA_PAIRS = 16
METADATA_KEY_CHARS = 64
METADATA_VALUE_CHARS = 512


class BatchInputError(ValueError):
    """An input file that cannot be a batch: what is wrong, on which line (1-based; 0: the whole)."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line
        self.message = message


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One request of a batch's input file."""

    index: int
    """Its place in the file, from 0: the output keeps the input's order."""
    custom_id: str
    body: dict[str, Any]

    @property
    def model(self) -> str:
        return str(self.body["model"])


def parse_input(data: bytes, endpoint: str, max_requests: int = MAX_REQUESTS) -> list[BatchLine]:
    """The requests of a batch input file for ``endpoint``; BatchInputError naming the first bad line.

    Each non-empty line is a JSON object ``{"custom_id", "method": "POST", "url": endpoint,
    "body": {"model": …, …}}``; custom ids are unique; a streamed request is refused (a batch's
    answers are whole)."""
    if endpoint not in ENDPOINTS:
        raise BatchInputError(0, f"endpoint {endpoint!r} takes no batch; use one of {', '.join(ENDPOINTS)}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BatchInputError(0, f"the file is not UTF-8 text (byte {error.start})") from error
    lines: list[BatchLine] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        line = _parse_line(number, raw, endpoint, seen)
        if len(lines) >= max_requests:
            raise BatchInputError(number, f"a batch holds at most {max_requests} requests; split the file")
        lines.append(BatchLine(len(lines), line[0], line[1]))
    if not lines:
        raise BatchInputError(0, "the file holds no request: write one JSON request per line")
    return lines


def check_input_file(data: bytes, max_requests: int = MAX_REQUESTS) -> str:
    """The endpoint of a batch input file (its first request's ``url``) once every line is a request
    for it; BatchInputError naming the first bad line. An upload with purpose ``batch`` is checked so."""
    try:
        first = next(line for line in data.decode("utf-8").splitlines() if line.strip())
        url = json.loads(first).get("url")
    except StopIteration:
        raise BatchInputError(0, "the file holds no request: write one JSON request per line") from None
    except (UnicodeDecodeError, ValueError, AttributeError):
        url = None  # parse_input says what is wrong with the line
    endpoint = url if url in ENDPOINTS else ENDPOINTS[0]
    if url is not None and url not in ENDPOINTS:
        raise BatchInputError(1, f"'url' is {url!r}; a batch's requests go to one of {', '.join(ENDPOINTS)}")
    parse_input(data, endpoint, max_requests)
    return endpoint


def _parse_line(number: int, raw: str, endpoint: str, seen: set[str]) -> tuple[str, dict[str, Any]]:
    try:
        item = json.loads(raw)
    except json.JSONDecodeError as error:
        raise BatchInputError(number, f"not JSON ({error.msg} at column {error.colno})") from error
    if not isinstance(item, dict):
        raise BatchInputError(number, "each line must be a JSON object with custom_id, method, url and body")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise BatchInputError(number, "'custom_id' must be a non-empty string")
    if custom_id in seen:
        raise BatchInputError(number, f"custom_id {custom_id!r} is used twice; each request needs its own")
    seen.add(custom_id)
    if item.get("method") != "POST":
        raise BatchInputError(number, "'method' must be \"POST\"")
    if item.get("url") != endpoint:
        raise BatchInputError(
            number,
            f"'url' is {item.get('url')!r} but the batch's endpoint is {endpoint!r}: one endpoint per batch",
        )
    body = item.get("body")
    if not isinstance(body, dict):
        raise BatchInputError(number, "'body' must be the request's JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise BatchInputError(number, "the body names no 'model'")
    if body.get("stream") is True:
        raise BatchInputError(number, "a batch's requests cannot stream: leave out 'stream'")
    return custom_id, body


def check_metadata(value: Any) -> dict[str, str] | None:
    """A batch's ``metadata`` as given, or ValueError saying OpenAI's bounds."""
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > METADATA_PAIRS:
        raise ValueError(f"'metadata' must be an object of at most {METADATA_PAIRS} string pairs")
    for key, item in value.items():
        if not isinstance(item, str) or len(key) > METADATA_KEY_CHARS or len(item) > METADATA_VALUE_CHARS:
            raise ValueError(
                f"'metadata' keys are strings of at most {METADATA_KEY_CHARS} characters and its values "
                f"strings of at most {METADATA_VALUE_CHARS}"
            )
    return dict(value)


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(12)


def result_line(custom_id: str, status: int, body: Any, request_id: str) -> dict[str, Any]:
    """One line of a batch's output (or error) file: the answer the endpoint gave the request."""
    return {
        "id": "batch_req_" + secrets.token_hex(12),
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body},
        "error": None,
    }


def unanswered_line(custom_id: str, code: str, message: str) -> dict[str, Any]:
    """One line of a batch's error file for a request never sent (the batch expired or was cancelled)."""
    return {
        "id": "batch_req_" + secrets.token_hex(12),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    """Lines as a JSONL file's bytes."""
    return b"".join(json.dumps(line, separators=(",", ":")).encode() + b"\n" for line in lines)


@dataclass(frozen=True, slots=True)
class Headroom:
    """How many batch requests may run now on a model's replicas, and why.

    Interactive traffic comes first: a batch request is sent only while the
    engines' queue (what they report running and waiting, less the batch's
    own) stays below ``share`` of their slots, and never more at once than
    the slots left under that bound."""

    slots: int
    """Slots of the model's ready replicas (each replica's parallel requests)."""
    interactive: int
    """Requests on them that are not the batch's."""
    batch: int
    """The batch's requests in flight on them."""
    share: float

    @property
    def allowed(self) -> int:
        bound = int(self.slots * self.share)
        if self.interactive >= max(1, bound) or self.slots == 0:
            return 0
        return max(0, max(1, bound) - self.interactive - self.batch)


def headroom(slots: int, engine_load: int, batch_in_flight: int, share: float) -> Headroom:
    """The headroom on replicas with ``slots`` whose engines report ``engine_load`` requests
    (running and waiting, the batch's own among them)."""
    interactive = max(0, engine_load - batch_in_flight)
    return Headroom(slots, interactive, batch_in_flight, share)
