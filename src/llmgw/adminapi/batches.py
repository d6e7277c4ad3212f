"""The admin API's shapes for batches: what ``/api/batches`` answers (docs/batches.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from llmgw.adminapi.schemas import AnswerModel


class BatchView(AnswerModel):
    """A batch as operators follow it: whose, what, how far, what it made."""

    id: str
    owner: str
    """Where the key that made it sits (every key there sees it on /v1/batches)."""
    key_id: str
    endpoint: str
    status: str
    total: int
    completed: int
    failed: int
    input_tokens: int
    output_tokens: int
    input_file_id: str
    output_file_id: str
    error_file_id: str
    errors: list[dict[str, Any]]
    created_at: datetime
    expires_at: datetime
    times: dict[str, float]
    """When it reached each status after validating (Unix seconds by status)."""

    @property
    def answered(self) -> int:
        return self.completed + self.failed
