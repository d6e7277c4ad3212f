"""An HTTP request a standby relays to the leader, and the leader's answer in chunks.

Headers are kept as (name, value) pairs in their order, repeats included.
"""

from __future__ import annotations

from dataclasses import dataclass

Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class RelayRequest:
    method: str
    path: str
    """With the query string."""
    headers: Headers = ()
    body: bytes = b""


@dataclass(frozen=True)
class RelayChunk:
    """Part of the answer: the first chunk carries status and headers; every chunk may carry body bytes."""

    status: int = 0
    headers: Headers = ()
    data: bytes = b""
