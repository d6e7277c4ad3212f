"""What a log line is about: request, project, model, replica, node, as context variables.

The request path (the gateway) and the sessions (control plane and agent) set
them; the JSON log formatter (``cli/output.py``) reads :func:`fields` and
adds those set to each line. Context variables follow asyncio tasks, so a
value set in one request's task is never seen by another's.

Setting one costs a context-variable set (tens of nanoseconds); nothing
reads them unless a formatter does.
"""

from __future__ import annotations

from contextvars import ContextVar

REQUEST_ID: ContextVar[str] = ContextVar("llmgw_request_id", default="")
"""The ``/v1`` request's id (its ``x-request-id``)."""
PROJECT: ContextVar[str] = ContextVar("llmgw_project", default="")
"""The project of the request's API key."""
MODEL: ContextVar[str] = ContextVar("llmgw_model", default="")
"""The model a request or a shard serves."""
REPLICA: ContextVar[str] = ContextVar("llmgw_replica", default="")
"""The replica answering the request, or the shard's replica."""
NODE: ContextVar[str] = ContextVar("llmgw_node", default="")
"""The node: an agent's own, or the one a control plane's session serves."""

FIELDS: tuple[tuple[str, ContextVar[str]], ...] = (
    ("request_id", REQUEST_ID),
    ("project", PROJECT),
    ("model", MODEL),
    ("replica", REPLICA),
    ("node", NODE),
)
"""Each field's name in a JSON log line, with its variable."""


def about(*, model: str = "", replica: str = "") -> None:
    """Name the model and replica the current task's log lines are about."""
    MODEL.set(model)
    REPLICA.set(replica)


def fields() -> dict[str, str]:
    """The fields set in the current context, by their names in a log line."""
    found: dict[str, str] = {}
    for name, variable in FIELDS:
        value = variable.get()
        if value:
            found[name] = value
    return found
