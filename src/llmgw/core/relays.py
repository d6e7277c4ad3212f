"""An HTTP request a standby relays to the leader, and the leader's answer in chunks.

Headers are kept as (name, value) pairs in their order, repeats included.
"""

from __future__ import annotations

from dataclasses import dataclass

Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class RelayPeer:
    """Who relays: its certificate's common name, and whether that certificate was issued for server
    use, as only control planes' are (a node's certificate is for client use alone)."""

    name: str
    control_plane: bool


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
