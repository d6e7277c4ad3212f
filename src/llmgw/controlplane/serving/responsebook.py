"""The gateway's :class:`~llmgw.gateway.response_store.ResponseBook` on the store, and its sweep.

Every process that serves ``/v1`` (the leader, a standby, a gateway worker)
keeps and reads responses here, on its client store (no fence), so a
follow-up (``previous_response_id``) or a ``GET /v1/responses/{id}`` that
reaches another process than the one that answered finds the response. A
keep trims the key's oldest past ``gateway.responses_per_key`` and some
expired rows; the leader's :class:`ResponseSweeper` removes the rest of the
expired and the oldest past ``gateway.responses_total``
(:mod:`llmgw.store.responses`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from llmgw.errors import StoreUnavailable
from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.response_store import PER_KEY, TOTAL, TTL_S, KeptResponse
from llmgw.store.responses import Responses

log = logging.getLogger(__name__)

SWEEP_S = 30.0
"""How often the leader sweeps kept responses."""
RETRY_AFTER_S = 5
"""Seconds a client is told to wait when the store cannot be read now."""


def _unavailable(error: StoreUnavailable) -> ApiError:
    return ApiError(
        503,
        f"Kept responses cannot be read now: {error.message}. Retry, or send the conversation in "
        "'input' instead of naming a previous response.",
        "responses_unavailable",
        retry_after=RETRY_AFTER_S,
    )


class StoreResponseBook:
    """Responses kept in the store, as the gateway asks for them."""

    def __init__(self, responses: Responses, *, ttl_s: float = TTL_S, per_key: int = PER_KEY) -> None:
        self._responses = responses
        self.ttl_s = ttl_s
        self.per_key = per_key

    async def keep(
        self,
        response_id: str,
        key_id: str,
        input_items: list[dict[str, Any]],
        output_items: list[dict[str, Any]],
        response: dict[str, Any],
    ) -> None:
        await self._responses.keep(
            response_id, key_id, input_items, output_items, response, ttl_s=self.ttl_s, per_key=self.per_key
        )

    async def get(self, response_id: str, key_id: str) -> KeptResponse | None:
        try:
            record = await self._responses.get(response_id, key_id)
        except StoreUnavailable as error:
            raise _unavailable(error) from error
        if record is None:
            return None
        return KeptResponse(
            record.key_id,
            tuple(record.input_items),
            tuple(record.output_items),
            record.kept_at.timestamp(),
            record.response,
        )

    async def delete(self, response_id: str, key_id: str) -> bool:
        try:
            return await self._responses.delete(response_id, key_id)
        except StoreUnavailable as error:
            raise _unavailable(error) from error


class ResponseSweeper:
    """The leader's duty: every :data:`SWEEP_S`, the expired responses and the oldest past ``total`` go."""

    def __init__(
        self,
        responses: Responses,
        total: int = TOTAL,
        every_s: float = SWEEP_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._responses = responses
        self.total = total
        self.every_s = every_s
        self._sleep = sleep

    async def run(self) -> None:
        """Sweep until cancelled; a store that cannot be reached is tried again the next time."""
        while True:
            try:
                swept = await self._responses.sweep(self.total)
            except StoreUnavailable as error:
                log.warning("kept responses were not swept: %s", error)
            else:
                if swept:
                    log.info("removed %d kept responses (expired, or past %d in all)", swept, self.total)
            await self._sleep(self.every_s)
