"""Responses kept for ``previous_response_id``: each key's own, for a bounded time and number.

OpenAI's Responses API lets a request continue an earlier one by naming it
(``previous_response_id``) instead of sending the conversation again. llmgw
keeps what that needs — the input items the earlier request had (its own
history included) and the output items it produced — in memory, under the
key that asked, for :attr:`ResponseStore.ttl_s` seconds; at most
:attr:`ResponseStore.per_key` per key and :attr:`ResponseStore.total` in all,
the oldest going first. A request sent with ``store: false`` is not kept.

A key never reads another key's responses: an id kept under another key
answers as one never kept. The engines are sent every request whole, so no
engine holds conversation state and any replica can answer a follow-up.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TTL_S = 3600.0
"""How long a response is kept for a follow-up."""
PER_KEY = 1000
"""Responses kept per key."""
TOTAL = 50_000
"""Responses kept in all."""


@dataclass(frozen=True, slots=True)
class KeptResponse:
    """What a follow-up needs of an earlier response."""

    key_id: str
    input_items: tuple[dict[str, Any], ...]
    """The conversation the earlier request was answered on: its history and its own input."""
    output_items: tuple[dict[str, Any], ...]
    """What it answered (messages, function calls)."""
    kept_at: float

    def conversation(self) -> list[dict[str, Any]]:
        """The items a follow-up continues from: the input, then the output."""
        return [*self.input_items, *self.output_items]


class ResponseStore:
    """Responses by id, each readable by its own key only, bounded in time and number."""

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

    def keep(
        self,
        response_id: str,
        key_id: str,
        input_items: list[dict[str, Any]],
        output_items: list[dict[str, Any]],
    ) -> None:
        """Keep a response for follow-ups by ``key_id``, dropping the oldest past the bounds."""
        if not response_id:
            return
        self._expire()
        self._forget(response_id)
        self._kept[response_id] = KeptResponse(key_id, tuple(input_items), tuple(output_items), self._clock())
        ids = self._per_key.setdefault(key_id, OrderedDict())
        ids[response_id] = None
        while len(ids) > self.per_key:
            self._forget(next(iter(ids)))
        while len(self._kept) > self.total:
            self._forget(next(iter(self._kept)))

    def get(self, response_id: str, key_id: str) -> KeptResponse | None:
        """The response ``response_id`` when ``key_id`` kept it and it has not expired; else None."""
        kept = self._kept.get(response_id)
        if kept is None or kept.key_id != key_id:
            return None
        if self._clock() - kept.kept_at > self.ttl_s:
            self._forget(response_id)
            return None
        return kept

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
