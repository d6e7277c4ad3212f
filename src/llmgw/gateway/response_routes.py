"""Kept responses read back and deleted, as the openai SDK calls them (``client.responses``)::

    GET    /v1/responses/{id}               the Response as it was answered      (retrieve)
    DELETE /v1/responses/{id}               {id, object: "response", deleted}   (delete)
    GET    /v1/responses/{id}/input_items   ?after=&limit=&order=  a list page   (input_items.list)

A key reads only the responses it made, and only those kept (not sent with
``store: false``, not expired, not deleted): any other id answers 404 as one
never made. The input items are the whole conversation the response was
answered on (an earlier response's, when it continued one), newest first
unless ``order=asc``; an item sent without an ``id`` is listed with one made
from the response's id and its place, the same at every call.
"""

from __future__ import annotations

import hashlib
from typing import Any

from starlette.types import Scope, Send

from llmgw.gateway.api_errors import ApiError, allow_only
from llmgw.gateway.exchange import Exchange, send_json
from llmgw.gateway.keys import KeyEntry
from llmgw.gateway.listing import list_page, page_limit, query_params
from llmgw.gateway.response_store import ResponseBook

RESPONSES = "/v1/responses"
ORDERS = ("asc", "desc")
ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}
"""The prefix of an id made for an input item sent without one, by its type."""


def response_route(path: str) -> bool:
    """Whether ``path`` names a kept response (``/v1/responses`` itself is the forwarded POST)."""
    return path.startswith(RESPONSES + "/")


def _not_found(response_id: str) -> ApiError:
    return ApiError(
        404,
        f"Response with id '{response_id}' not found: responses are kept for the key that made them, "
        "for a bounded time, and not at all when sent with store: false.",
        "response_not_found",
        "response_id",
    )


def listed_items(response_id: str, items: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """The input items as a list shows them: each with an ``id`` and a message's text as content parts."""
    shown: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        listed = dict(item)
        kind = listed.setdefault("type", "message")
        if not isinstance(listed.get("id"), str) or not listed["id"]:
            digest = hashlib.sha256(f"{response_id}/{index}".encode()).hexdigest()[:32]
            listed["id"] = f"{ID_PREFIXES.get(kind, 'item')}_{digest}"
        if kind == "message" and isinstance(listed.get("content"), str):
            part = "output_text" if listed.get("role") == "assistant" else "input_text"
            listed["content"] = [{"type": part, "text": listed["content"]}]
        shown.append(listed)
    return shown


def _page(items: list[dict[str, Any]], query: dict[str, str]) -> dict[str, Any]:
    """The page of ``items`` the query asks for; 400 naming a bad ``limit``, ``order`` or ``after``."""
    limit = page_limit(query)
    order = query.get("order") or "desc"
    if order not in ORDERS:
        raise ApiError(400, "'order' must be asc or desc.", "invalid_request", "order")
    ordered = items if order == "asc" else items[::-1]
    after = query.get("after")
    start = 0
    if after:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            message = f"'after' must be the id of an input item of this response, not '{after}'."
            raise ApiError(400, message, "invalid_request", "after")
        start = ids.index(after) + 1
    chosen = ordered[start : start + limit]
    return list_page(chosen, start + limit < len(ordered))


class ResponseRoutes:
    """``/v1/responses/{id}`` and its input items: each key's own, asked of the :class:`ResponseBook`."""

    def __init__(self, book: ResponseBook) -> None:
        self.book = book

    async def serve(self, scope: Scope, send: Send, exchange: Exchange, path: str, key: KeyEntry) -> None:
        method: str = scope["method"]
        response_id, _, rest = path[len(RESPONSES) + 1 :].partition("/")
        if not response_id or rest not in ("", "input_items"):
            raise ApiError(
                404,
                f"Invalid URL ({method} {path}): kept responses are served at GET and DELETE "
                "/v1/responses/{id} and GET /v1/responses/{id}/input_items.",
                "unknown_url",
            )
        if rest:
            allow_only(method, path, "GET")
        else:
            allow_only(method, path, "GET", "DELETE")
        if method == "DELETE":
            if not await self.book.delete(response_id, key.key_id):
                raise _not_found(response_id)
            await send_json(send, exchange, 200, {"id": response_id, "object": "response", "deleted": True})
            return
        kept = await self.book.get(response_id, key.key_id)
        if kept is None:
            raise _not_found(response_id)
        if not rest:
            await send_json(send, exchange, 200, kept.response)
            return
        query = query_params(scope.get("query_string", b""))
        page = _page(listed_items(response_id, kept.input_items), query)
        await send_json(send, exchange, 200, page)
