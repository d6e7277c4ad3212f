"""An HTTP request a standby relays to the leader, and the leader's answer in chunks.

Both directions stream: the request's head goes first, then its body in
chunks as the client sends them, then an end; the answer comes back in chunks
as the leader's app writes them. Headers are kept as (name, value) pairs in
their order, repeats included.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Protocol

Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class RelayPeer:
    """Who relays: its certificate's common name, and whether that certificate was issued for server
    use, as only control planes' are (a node's certificate is for client use alone)."""

    name: str
    control_plane: bool


@dataclass(frozen=True)
class RelayRequest:
    """A relayed request's head; its body travels apart, in chunks."""

    method: str
    path: str
    """With the query string."""
    headers: Headers = ()


@dataclass(frozen=True)
class RelayChunk:
    """Part of the answer: the first chunk carries status and headers; every chunk may carry body bytes."""

    status: int = 0
    headers: Headers = ()
    data: bytes = b""


class IncomingRelay(Protocol):
    """A relayed request as the leader receives it: nothing is read before :meth:`head` is awaited.

    :meth:`body` yields the body's chunks as they arrive and ends after the
    last one; it raises :class:`llmgw.errors.ChannelClosed` when the request
    was cut off before its end (the standby's client went away, or the call
    broke).
    """

    async def head(self) -> RelayRequest: ...

    def body(self) -> AsyncIterator[bytes]: ...


class RelayInHand:
    """An :class:`IncomingRelay` whose head is known already and whose body comes from an iterable:
    a relay within one process."""

    def __init__(self, request: RelayRequest, body: AsyncIterable[bytes] | None = None) -> None:
        self._request = request
        self._body = body

    async def head(self) -> RelayRequest:
        return self._request

    async def body(self) -> AsyncIterator[bytes]:
        if self._body is not None:
            async for chunk in self._body:
                yield chunk
