"""Knowledge at request time: collections searched for a request, their passages put into its prompt.

A chat completion or a Responses request names collections in the extension
field ``knowledge`` (``{"collections": [...], "limit": 5}``, which the
``openai`` SDK sends through ``extra_body``), or its key has default
collections (:attr:`~llmgw.gateway.keys.KeyEntry.collections`). The gateway
asks its :class:`~llmgw.core.knowledge.KnowledgeSearch` for the best passages
with the last user message as the query, and puts them into the prompt as one
system message (:func:`passages_message`): appended to the request's own
leading system message, or sent as a new first message; for ``/v1/responses``
appended to ``instructions``. The engine is never sent ``knowledge``; an
engine that takes it (``cache_salt`` in :mod:`llmgw.core.engines`) is sent
``cache_salt`` (:func:`llmgw.core.knowledge.cache_salt` of the collections
searched), and the router keys the prompt's prefix and blocks under that salt.
The answer carries the passages as ``sources``
(:mod:`llmgw.gateway.sources`).

A collection the key may not read answers 404 exactly as one that does not
exist; a search that fails or takes longer than the gateway's
``knowledge_timeout_s`` answers 503 ``knowledge_unavailable``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmgw.core.knowledge import KnowledgeSearch, Passage, UnknownCollection, cache_salt
from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.keys import KeyEntry

log = logging.getLogger(__name__)

FIELD = "knowledge"
"""The request's extension field naming collections."""
ROUTES = frozenset({"/v1/chat/completions", "/v1/responses"})
"""The routes that search collections."""
MAX_COLLECTIONS = 8
"""Most collections one request may search."""
MAX_NAME = 200
"""Longest collection name."""
DEFAULT_LIMIT = 5
MAX_LIMIT = 20
"""Passages put into a prompt: ``limit`` from 1 to this, :data:`DEFAULT_LIMIT` when not given."""
HEADER = (
    "Answer using the numbered passages below where they help, and cite them as [n]. "
    "If they do not hold the answer, say so."
)
"""The first line of the system message carrying the passages."""


@dataclass(frozen=True, slots=True)
class Ask:
    """The collections a request searches and how many passages it takes."""

    collections: tuple[str, ...]
    limit: int = DEFAULT_LIMIT


@dataclass(frozen=True, slots=True)
class Retrieved:
    """What a search brought one request: its cache salt and its sources as the answer carries them."""

    salt: str
    sources: bytes
    """The ``sources`` array as JSON (:func:`sources_json`)."""


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, "invalid_knowledge", param)


def asked(data: dict[str, Any], key: KeyEntry, path: str) -> Ask | None:
    """What ``data`` (sent by ``key`` to ``path``) asks to search; None: nothing (today's path).

    400 naming the field for a bad shape; the key's default collections when the request names none.
    """
    field = data.get(FIELD)
    if field is None:
        if key.collections and path in ROUTES:
            return Ask(key.collections)
        return None
    if path not in ROUTES:
        raise _bad(
            f"'{FIELD}' is served on /v1/chat/completions and /v1/responses, not {path}; "
            f"send the request without '{FIELD}', or to one of those routes.",
            FIELD,
        )
    if not isinstance(field, dict):
        raise _bad(f'\'{FIELD}\' must be an object: {{"collections": ["NAME", ...], "limit": 5}}.', FIELD)
    unknown = sorted(set(field) - {"collections", "limit"})
    if unknown:
        raise _bad(
            f"'{FIELD}' takes 'collections' and 'limit', not {', '.join(repr(u) for u in unknown)}.",
            f"{FIELD}.{unknown[0]}",
        )
    names = field.get("collections")
    param = f"{FIELD}.collections"
    if not isinstance(names, list) or not names:
        raise _bad(f"'{param}' must be a non-empty list of collection names.", param)
    if len(names) > MAX_COLLECTIONS:
        raise _bad(f"'{param}' names {len(names)} collections; send at most {MAX_COLLECTIONS}.", param)
    for name in names:
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME:
            raise _bad(
                f"'{param}' holds {json.dumps(name)[:60]}: each name must be a non-empty string of at "
                f"most {MAX_NAME} characters.",
                param,
            )
    limit = field.get("limit", DEFAULT_LIMIT)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise _bad(f"'{FIELD}.limit' must be a whole number from 1 to {MAX_LIMIT}.", f"{FIELD}.limit")
    return Ask(tuple(dict.fromkeys(names)), limit)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") != "input_image"]
        return " ".join(t for t in texts if isinstance(t, str))
    return ""


def query_of(data: dict[str, Any], path: str) -> str:
    """The last user message's text: what the collections are searched for (400 when there is none)."""
    if path == "/v1/responses":
        items = data.get("input")
        param = "input"
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
    else:
        items = data.get("messages")
        param = "messages"
    if isinstance(items, list):
        for item in reversed(items):
            if isinstance(item, dict) and item.get("role") == "user":
                if text := _text(item.get("content")).strip():
                    return text
    raise _bad(
        f"'{FIELD}' searches with the last user message's text, and '{param}' has none; "
        "send a user message with text.",
        param,
    )


async def search(
    searcher: KnowledgeSearch | None, key: KeyEntry, ask: Ask, query: str, timeout_s: float, retry_s: int
) -> Sequence[Passage]:
    """The passages found; 404 for a collection ``key`` may not read, 503 when the search fails."""
    if searcher is None:
        raise ApiError(
            503,
            "Knowledge collections are not served by this gateway (no search is configured).",
            "knowledge_unavailable",
            FIELD,
            hint=f"send the request without '{FIELD}' (and with a key without default collections), "
            "or ask an administrator to enable knowledge collections",
        )
    try:
        return await asyncio.wait_for(
            searcher.search(key.place, ask.collections, query, ask.limit), timeout_s
        )
    except UnknownCollection as error:
        raise ApiError(
            404,
            f"The collection '{error.name}' does not exist; `llmgw ctl kb list` lists the collections "
            "your key can read.",
            "collection_not_found",
            f"{FIELD}.collections",
        ) from None
    except (TimeoutError, Exception) as error:
        why = "took too long" if isinstance(error, TimeoutError) else f"failed ({error})"
        log.warning("knowledge search over %s %s", ", ".join(ask.collections), why)
        raise ApiError(
            503,
            f"Searching the knowledge collections {why}. Retry in {retry_s} s; if it lasts, an "
            "administrator checks the embedding model's replicas (`llmgw status`).",
            "knowledge_unavailable",
            FIELD,
            retry_after=retry_s,
        ) from None


def passages_message(passages: Sequence[Passage]) -> str:
    """The text put into the prompt: :data:`HEADER`, then each passage numbered with its source."""
    blocks = [HEADER]
    for number, passage in enumerate(passages, 1):
        source = (
            f"[{number}] {passage.document} (collection {passage.collection}, passage {passage.position})"
        )
        blocks.append(f"{source}\n{passage.text}")
    return "\n\n".join(blocks)


def sources_json(passages: Sequence[Passage]) -> bytes:
    """The answer's ``sources``: each passage as ``{collection, document, position, score, text}``."""
    return json.dumps(
        [
            {
                "collection": p.collection,
                "document": p.document,
                "position": p.position,
                "score": p.score,
                "text": p.text,
            }
            for p in passages
        ],
        ensure_ascii=False,
        separators=(",", ":"),
    ).encode()


def with_passages(data: dict[str, Any], path: str, passages: Sequence[Passage]) -> dict[str, Any]:
    """``data`` as the engine gets it: the passages in its prompt, ``knowledge`` and any
    ``cache_salt`` of the client's taken out (the gateway's goes in per engine: :func:`salted`)."""
    out = {k: v for k, v in data.items() if k not in (FIELD, "cache_salt")}
    if not passages:
        return out
    text = passages_message(passages)
    if path == "/v1/responses":
        instructions = out.get("instructions")
        out["instructions"] = (
            f"{instructions}\n\n{text}" if isinstance(instructions, str) and instructions else text
        )
        return out
    messages = list(out.get("messages") or [])
    first = messages[0] if messages else None
    if isinstance(first, dict) and first.get("role") == "system" and isinstance(first.get("content"), str):
        messages[0] = {**first, "content": f"{first['content']}\n\n{text}"}
    else:
        messages.insert(0, {"role": "system", "content": text})
    out["messages"] = messages
    return out


def salted(body: bytes, salt: str) -> bytes:
    """``body`` (a JSON object without ``cache_salt``) with ``cache_salt`` set: a splice of bytes."""
    start = len(body) - len(body.lstrip())
    if body[start : start + 1] != b"{":
        return body
    rest = body[start + 1 :]
    separator = b"" if rest.lstrip().startswith(b"}") else b","
    return body[: start + 1] + b'"cache_salt":' + json.dumps(salt).encode() + separator + rest


def retrieved(collections: Sequence[str], passages: Sequence[Passage]) -> Retrieved:
    return Retrieved(cache_salt(collections), sources_json(passages))
