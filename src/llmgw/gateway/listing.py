"""List pages as OpenAI answers them: ``{object: "list", data, first_id, last_id, has_more}``.

The ``/v1`` list routes (``/v1/batches``, ``/v1/files``, ``/v1/responses/{id}/input_items``)
read their query here, and a ``limit`` outside 1..:data:`LIST_LIMIT` answers
400 naming it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

from llmgw.gateway.api_errors import ApiError

LIST_LIMIT = 100
"""Most items one list page gives (OpenAI's bound)."""
DEFAULT_LIMIT = 20


def query_params(raw: bytes) -> dict[str, str]:
    """A request's query string as names and values (the last of a repeated name)."""
    return dict(parse_qsl(raw.decode("latin-1"), keep_blank_values=True))


def page_limit(query: dict[str, str], most: int = LIST_LIMIT, default: int = DEFAULT_LIMIT) -> int:
    """The query's ``limit`` (``default`` when not given); 400 naming it when not a whole number in
    1..``most``."""
    text = query.get("limit") or str(default)
    try:
        limit = int(text)
    except ValueError:
        limit = 0
    if not 1 <= limit <= most:
        raise ApiError(400, f"'limit' must be a whole number from 1 to {most}.", "invalid_request", "limit")
    return limit


def list_page(items: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    """One page of ``items`` (each with an ``id``), and whether more follow."""
    return {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": more,
    }
