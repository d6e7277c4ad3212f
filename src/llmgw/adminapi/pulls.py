"""The admin API's shapes for pulls: what ``/api/mirror/pulls`` takes and answers."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr

from llmgw.adminapi.schemas import AnswerModel, RequestModel


class PullRequest(RequestModel):
    source: str = Field(min_length=4, max_length=300)
    """``hf:ORG/REPO[@REVISION]`` or ``ollama:NAME[:TAG]``."""
    hf_token: SecretStr | None = None
    """A Hugging Face token for this pull alone (gated or private repositories); never shown nor kept.
    Without it the control plane's ``HF_TOKEN`` is used, if it has one."""


class PullFileView(AnswerModel):
    filename: str
    size: int
    done: int
    """Bytes received so far."""
    sha256: str = ""
    """The file's sha256 in the mirror, once checked and kept."""
    checked_by: str = ""
    """The registry's checksum it was checked against."""


class PullView(AnswerModel):
    id: str
    source: str
    state: Literal["running", "done", "failed"]
    started: float
    revision: str = ""
    """The commit (Hugging Face) or tag (Ollama) pulled."""
    files: list[PullFileView] = []
    bytes_done: int = 0
    bytes_total: int = 0
    error: str = ""
    hint: str = ""
    catalog_source: dict[str, Any] | None = None
    """The model's ``source`` for a definition (``POST /api/models``), once done."""
