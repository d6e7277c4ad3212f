"""The admin API's shapes for limits: what ``/api/limits`` takes and answers."""

from __future__ import annotations

from llmgw.adminapi.schemas import AnswerModel, RequestModel


class LimitsBody(RequestModel):
    """Limits of one subject; a field left out (or null) is no limit on that."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    """Prompt plus completion tokens per minute."""
    concurrent: int | None = None
    """Requests answered at once."""
    tokens_per_day: int | None = None
    """Tokens per UTC day."""
    tokens_per_month: int | None = None
    """Tokens per UTC calendar month."""
    usd_per_day: float | None = None
    """Money per UTC day, in the cluster's currency (``pricing.currency``; USD unless set), at the
    models' prices (``pricing.models.<model>``); spent: 429 ``budget_exceeded`` until the day ends."""
    usd_per_month: float | None = None
    """Money per UTC calendar month, in the cluster's currency."""
    models: list[str] | None = None
    """The only models (or adapters) that may be asked for."""
    expires_s: float | None = None
    """Unix time after which requests are refused."""
    priority: int | None = None
    """Where its requests wait in a busy model's queue (``gateway.flow.mode: fair``), 0 (lowest,
    sheddable) to 9; a key's may lower its owners', never raise it; none set anywhere: 5."""


class LimitsView(LimitsBody, AnswerModel):
    subject: str
