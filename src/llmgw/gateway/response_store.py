"""Responses kept for ``previous_response_id`` and ``/v1/responses/{id}``: each key's own, bounded.

OpenAI's Responses API lets a request continue an earlier one by naming it
(``previous_response_id``) instead of sending the conversation again, and
lets a client read a response back (``GET /v1/responses/{id}``, its input
items) or delete it. llmgw keeps what that needs — the input items the
earlier request had (its own history included), the output items it
produced and the response object as it was answered — under the key that
asked, in a :class:`ResponseBook`. A request sent with ``store: false`` is
not kept.

The gateway asks the book it was given: a control plane and its gateway
workers pass one on the store (``controlplane/serving/responsebook.py``), so
a follow-up that reaches another process finds the response; a gateway built
with none keeps them in its own memory (:class:`ResponseStore`), for
:attr:`ResponseStore.ttl_s` seconds, at most :attr:`ResponseStore.per_key`
per key and :attr:`ResponseStore.total` in all, the oldest going first.

A key never reads another key's responses: an id kept under another key
answers as one never kept. The engines are sent every request whole, so no
engine holds conversation state and any replica can answer a follow-up.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

TTL_S = 3600.0
"""How long a response is kept for a follow-up."""
PER_KEY = 1000
"""Responses kept per key."""
TOTAL = 50_000
"""Responses kept in all."""


@dataclass(frozen=True, slots=True)
class KeptResponse:
    """What a follow-up, and a client reading it back, needs of an earlier response."""

    key_id: str
    input_items: tuple[dict[str, Any], ...]
    """The conversation the earlier request was answered on: its history and its own input."""
    output_items: tuple[dict[str, Any], ...]
    """What it answered (messages, function calls)."""
    kept_at: float
    """When it was kept, in seconds of the book's clock."""
    response: dict[str, Any] = field(default_factory=dict)
    """The response object as it was answered (what ``GET /v1/responses/{id}`` gives)."""

    def conversation(self) -> list[dict[str, Any]]:
        """The items a follow-up continues from: the input, then the output."""
        return [*self.input_items, *self.output_items]


class ResponseBook(Protocol):
    """Where a gateway keeps responses: each readable and deletable by the key that made it only."""

    @property
    def ttl_s(self) -> float:
        """How long a response is kept (said in the answer to a follow-up that finds none)."""
        ...

    async def keep(
        self,
        response_id: str,
        key_id: str,
        input_items: list[dict[str, Any]],
        output_items: list[dict[str, Any]],
        response: dict[str, Any],
    ) -> None:
        """Keep a response for ``key_id`` (replacing one of the same id), within the book's bounds."""
        ...

    async def get(self, response_id: str, key_id: str) -> KeptResponse | None:
        """The response when ``key_id`` kept it and it has not expired; else None."""
        ...

    async def delete(self, response_id: str, key_id: str) -> bool:
        """Forget the response; False when ``key_id`` has none of that id."""
        ...


class ResponseStore:
    """A :class:`ResponseBook` in this process's memory, bounded in time and number."""

    def __init__(
        self,
        ttl_s: float = TTL_S,
        per_key: int = PER_KEY,
        total: int = TOTAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.per_key = per_key
        self.total = total
        self._clock = clock
        self._kept: OrderedDict[str, KeptResponse] = OrderedDict()
        self._per_key: dict[str, OrderedDict[str, None]] = {}

    def __len__(self) -> int:
        return len(self._kept)

    async def keep(
        self,
        response_id: str,
        key_id: str,
        input_items: list[dict[str, Any]],
        output_items: list[dict[str, Any]],
        response: dict[str, Any],
    ) -> None:
        """Keep a response for follow-ups by ``key_id``, dropping the oldest past the bounds."""
        if not response_id:
            return
        self._expire()
        self._forget(response_id)
        self._kept[response_id] = KeptResponse(
            key_id, tuple(input_items), tuple(output_items), self._clock(), response
        )
        ids = self._per_key.setdefault(key_id, OrderedDict())
        ids[response_id] = None
        while len(ids) > self.per_key:
            self._forget(next(iter(ids)))
        while len(self._kept) > self.total:
            self._forget(next(iter(self._kept)))

    async def get(self, response_id: str, key_id: str) -> KeptResponse | None:
        """The response ``response_id`` when ``key_id`` kept it and it has not expired; else None."""
        kept = self._kept.get(response_id)
        if kept is None or kept.key_id != key_id:
            return None
        if self._clock() - kept.kept_at > self.ttl_s:
            self._forget(response_id)
            return None
        return kept

    async def delete(self, response_id: str, key_id: str) -> bool:
        """Forget the response ``response_id`` of ``key_id``; False when it has none of that id."""
        if await self.get(response_id, key_id) is None:
            return False
        self._forget(response_id)
        return True

    def _expire(self) -> None:
        """Drop expired responses from the oldest on (they were kept in order)."""
        limit = self._clock() - self.ttl_s
        while self._kept:
            oldest_id, oldest = next(iter(self._kept.items()))
            if oldest.kept_at >= limit:
                return
            self._forget(oldest_id)

    def _forget(self, response_id: str) -> None:
        kept = self._kept.pop(response_id, None)
        if kept is None:
            return
        ids = self._per_key.get(kept.key_id)
        if ids is not None:
            ids.pop(response_id, None)
            if not ids:
                del self._per_key[kept.key_id]
