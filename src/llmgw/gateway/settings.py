"""The gateway's settings: how long requests wait, how upstream calls are bounded."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


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
    retry_after_s: int = Field(default=5, ge=0)
    """Seconds a client is told (``Retry-After``) to wait when no replica can serve it now."""
    max_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    """Largest request body accepted; larger ones get 413."""
    keepalive_s: float = Field(default=4.0, ge=0)
    """How long an idle upstream connection is kept for reuse; keep it below the engines' own
    keep-alive (uvicorn-based engines close after 5 s) so a reused connection is never a stale one."""
    access_log: bool = False
    """Log one line per /v1 request (logger ``llmgw.access``): status, duration, tokens."""
