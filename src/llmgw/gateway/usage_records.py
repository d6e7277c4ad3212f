"""The usage record of a request a replica answered: its tokens, its timings and what it cost.

The cost is its model's price when the request was admitted (``exchange.price``,
one lookup in the prices the control plane fed, :mod:`llmgw.core.pricing`)
times the tokens its engine counted, the cached prompt tokens at their price:
usage stores it as counted, so a price changed later leaves it as it was.
"""

from __future__ import annotations

import time

from llmgw.gateway import metrics
from llmgw.gateway.exchange import Exchange
from llmgw.gateway.keys import KeyEntry
from llmgw.gateway.usage import UsageRecord


def record_of(exchange: Exchange, key: KeyEntry) -> UsageRecord:
    """The usage of an ended request, with its timings and its cost."""
    ended = time.perf_counter()
    first = exchange.first_token
    return UsageRecord(
        key_id=key.key_id,
        model=exchange.model,
        replica_id=exchange.replica_id,
        prompt_tokens=exchange.prompt_tokens,
        completion_tokens=exchange.completion_tokens,
        status=exchange.status,
        duration_s=ended - exchange.started,
        place=metrics.project_of(key),
        ttft_s=first - exchange.started if first else None,
        generation_s=ended - (first or exchange.started),
        cached_tokens=exchange.cached_tokens,
        cost=exchange.costed(),
    )
