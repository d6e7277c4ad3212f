"""The gateway's settings: how long requests wait, how upstream calls are bounded."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from llmgw.core.fallbacks import FallbackSettings
from llmgw.core.flowqueue import FlowSettings


class GatewaySettings(BaseModel):
    """Settings of the ``/v1`` data path, passed to :class:`~llmgw.gateway.app.Gateway` as one object."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    request_wait_s: float = Field(default=60.0, ge=0)
    """How long a request waits for a ready replica of its model (e.g. one started on demand)."""
    upstream_timeout_s: float = Field(default=600.0, gt=0)
    """Longest silence from a replica: the wait for the next streamed bytes, or for a whole
    non-streamed answer."""
    connect_timeout_s: float = Field(default=5.0, gt=0)
    """Longest wait to open a connection to a replica before trying another."""
    provider_ca_file: str = ""
    """A PEM file of CAs trusted for ``https://`` providers besides the system's (a private CA); empty:
    the system's trust store alone."""
    retry_after_s: int = Field(default=5, ge=0)
    """Seconds a client is told (``Retry-After``) to wait when no replica can serve it now."""
    max_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    """Largest request body accepted; larger ones get 413."""
    keepalive_s: float = Field(default=4.0, ge=0)
    """How long an idle upstream connection is kept for reuse; keep it below the engines' own
    keep-alive (uvicorn-based engines close after 5 s) so a reused connection is never a stale one."""
    access_log: bool = False
    """Log one line per /v1 request (logger ``llmgw.access``): status, duration, tokens."""
    job_poll_s: float = Field(default=0.5, gt=0)
    """How often a job's progress is read from its replica's gate while it waits (docs/comfyui-api.md)."""
    job_timeout_s: float = Field(default=3600.0, gt=0)
    """Longest a job (or a picture) may take from its arrival; past it, it fails and is cancelled."""
    jobs_kept: int = Field(default=1000, gt=0)
    """Jobs held in memory at most; past it the oldest ended one goes (none ended: 429)."""
    job_kept_s: float = Field(default=3600.0, gt=0)
    """How long an ended job can still be read back."""
    files_kept_s: float = Field(default=3600.0, gt=0)
    """How long a made file (a picture's ``url``, a job's files) can be read at ``/v1/files/{id}``."""
    files_max_bytes: int = Field(default=1024 * 1024 * 1024, gt=0)
    """Bytes of made files kept in memory at most; the oldest go first."""
    responses_kept_s: float = Field(default=3600.0, gt=0)
    """How long a response is kept for ``previous_response_id`` and ``/v1/responses/{id}``."""
    responses_per_key: int = Field(default=1000, gt=0)
    """Responses kept per key at most; past it the key's oldest go."""
    responses_total: int = Field(default=50_000, gt=0)
    """Responses kept in all at most; past it the oldest go."""
    knowledge_timeout_s: float = Field(default=10.0, gt=0)
    """Longest a request's search of knowledge collections may take before it answers 503."""
    fallbacks: FallbackSettings = Field(default_factory=FallbackSettings)
    """How far a request may fall to its model's fallbacks, and when a failing one is skipped."""
    flow: FlowSettings = Field(default_factory=FlowSettings)
    """Whether a busy model's requests wait in the gateway by priority and fair share, and how long."""
