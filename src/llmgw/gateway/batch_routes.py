"""OpenAI's Batch API on ``/v1/batches``: create, list, retrieve, cancel, as the openai SDK calls them.

::

    POST /v1/batches                 {input_file_id, endpoint, completion_window, metadata?}
    GET  /v1/batches                 ?after=&limit=  newest first: {object: list, data, has_more …}
    GET  /v1/batches/{id}            the Batch
    POST /v1/batches/{id}/cancel     the Batch, cancelling (or as it is, once ended)

A batch belongs to the place of the key that made it: every key of that
place sees it, any other answers 404 as for an id never made. The gateway
keeps no batch itself: it asks a :class:`BatchBook` (the control plane's, on
the store) and the leader runs the batch (``controlplane/serving/batching.py``).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from starlette.types import Receive, Scope, Send

from llmgw.core.batches import COMPLETION_WINDOWS, ENDPOINTS, check_metadata
from llmgw.gateway.access import Access
from llmgw.gateway.api_errors import ApiError, allow_only
from llmgw.gateway.bodies import read_body
from llmgw.gateway.exchange import Exchange, send_json
from llmgw.gateway.keys import KeyEntry
from llmgw.gateway.listing import list_page, page_limit, query_params

BATCHES = "/v1/batches"
CREATE_BODY_BYTES = 64 * 1024


def batch_route(path: str) -> bool:
    return path == BATCHES or path.startswith(BATCHES + "/")


class BatchBook(Protocol):
    """Where batches are kept (the control plane implements it on the store)."""

    async def create(
        self,
        key: KeyEntry,
        *,
        input_file_id: str,
        endpoint: str,
        completion_window: str,
        metadata: dict[str, str] | None,
    ) -> dict[str, Any]:
        """Record a batch of the file's requests for ``key``; the Batch, validating. ApiError (4xx)
        when the file is not one of the key's place with purpose ``batch``."""
        ...

    async def get(self, key: KeyEntry, batch_id: str) -> dict[str, Any] | None:
        """The Batch when it is of ``key``'s place; None otherwise."""
        ...

    async def list(self, key: KeyEntry, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
        """The place's Batches, newest first after ``after``; and whether more follow."""
        ...

    async def cancel(self, key: KeyEntry, batch_id: str) -> dict[str, Any] | None:
        """Ask the batch to stop (cancelling); the Batch, or None when it is not of ``key``'s place."""
        ...


def _not_found(batch_id: str) -> ApiError:
    return ApiError(
        404,
        f"No batch found with id '{batch_id}'; GET /v1/batches lists the batches of your key's place.",
        "batch_not_found",
        "batch_id",
    )


def _invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request", param)


def create_fields(data: Any) -> tuple[str, str, str, dict[str, str] | None]:
    """The input file, endpoint, window and metadata of a create request; 400 saying what is wrong."""
    if not isinstance(data, dict):
        raise _invalid("The body must be a JSON object with input_file_id, endpoint and completion_window.")
    file_id = data.get("input_file_id")
    if not isinstance(file_id, str) or not file_id:
        raise _invalid("'input_file_id' must name a file uploaded with purpose 'batch'.", "input_file_id")
    endpoint = data.get("endpoint")
    if endpoint not in ENDPOINTS:
        raise _invalid(f"'endpoint' must be one of {', '.join(ENDPOINTS)}.", "endpoint")
    window = data.get("completion_window")
    if window not in COMPLETION_WINDOWS:
        raise _invalid(
            f"'completion_window' must be one of {', '.join(COMPLETION_WINDOWS)}.", "completion_window"
        )
    try:
        metadata = check_metadata(data.get("metadata"))
    except ValueError as error:
        raise _invalid(str(error), "metadata") from error
    return file_id, str(endpoint), str(window), metadata


class BatchRoutes:
    """``/v1/batches``: each request's key checked, then asked of the :class:`BatchBook`."""

    def __init__(self, access: Access, book: BatchBook | None) -> None:
        self.access = access
        self.book = book

    async def serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        exchange: Exchange,
        path: str,
        key: KeyEntry,
        length: bytes | None,
    ) -> None:
        method: str = scope["method"]
        book = self.book
        if book is None:
            raise ApiError(
                404,
                "This gateway keeps no batches: send /v1/batches to a control plane.",
                "unknown_url",
            )
        rest = path[len(BATCHES) :].strip("/")
        if not rest:
            allow_only(method, path, "GET", "POST")
            if method == "POST":
                body = await read_body(receive, length, CREATE_BODY_BYTES)
                if body is None:
                    return
                try:
                    data = json.loads(body)
                except ValueError as error:
                    raise _invalid("The body must be JSON.") from error
                file_id, endpoint, window, metadata = create_fields(data)
                created = await book.create(
                    key, input_file_id=file_id, endpoint=endpoint, completion_window=window, metadata=metadata
                )
                await send_json(send, exchange, 200, created)
                return
            query = query_params(scope.get("query_string", b""))
            batches, more = await book.list(key, query.get("after") or None, page_limit(query))
            await send_json(send, exchange, 200, list_page(batches, more))
            return
        batch_id, _, action = rest.partition("/")
        if action == "cancel":
            allow_only(method, path, "POST")
            found = await book.cancel(key, batch_id)
        elif not action:
            allow_only(method, path, "GET")
            found = await book.get(key, batch_id)
        else:
            raise ApiError(404, f"Invalid URL ({method} {path}).", "unknown_url")
        if found is None:
            raise _not_found(batch_id)
        await send_json(send, exchange, 200, found)
