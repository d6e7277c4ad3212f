"""Relayed HTTP requests and their answers' chunks, to and from the protocol's messages.

Bodies cross in pieces of at most :data:`RELAY_CHUNK` bytes, whatever size the
HTTP side reads or writes at once, so that no message comes near the
channel's message limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from llmgw.core.relays import Headers, RelayChunk, RelayRequest
from llmgw.protocol import agent_pb2 as pb

RELAY_CHUNK = 256 << 10
"""Body bytes in one relay message, either way."""


def _encode_headers(headers: Headers) -> list[pb.HttpHeader]:
    return [pb.HttpHeader(name=name, value=value) for name, value in headers]


def _decode_headers(headers: Iterable[pb.HttpHeader]) -> Headers:
    return tuple((h.name, h.value) for h in headers)


def _pieces(data: bytes) -> Iterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(data), RELAY_CHUNK):
        yield bytes(view[start : start + RELAY_CHUNK])


def encode_relay_head(request: RelayRequest) -> pb.RelayRequest:
    """The first message of a relayed request: its head, no body yet."""
    return pb.RelayRequest(method=request.method, path=request.path, headers=_encode_headers(request.headers))


def encode_relay_body(data: bytes) -> Iterator[pb.RelayRequest]:
    """Messages carrying body bytes, each at most :data:`RELAY_CHUNK`; none for no bytes."""
    for piece in _pieces(data):
        yield pb.RelayRequest(body=piece)


RELAY_END = pb.RelayRequest(end=True)
"""The last message of a relayed request: its body is whole."""


def decode_relay_head(message: pb.RelayRequest) -> RelayRequest:
    return RelayRequest(method=message.method, path=message.path, headers=_decode_headers(message.headers))


def encode_relay_chunks(chunk: RelayChunk) -> Iterator[pb.RelayChunk]:
    """One answer chunk as messages of at most :data:`RELAY_CHUNK` body bytes; the first keeps the
    status and headers (and goes even without bytes)."""
    pieces = list(_pieces(chunk.data)) or [b""]
    yield pb.RelayChunk(status=chunk.status, headers=_encode_headers(chunk.headers), data=pieces[0])
    for piece in pieces[1:]:
        yield pb.RelayChunk(data=piece)


def decode_relay_chunk(message: pb.RelayChunk) -> RelayChunk:
    return RelayChunk(status=message.status, headers=_decode_headers(message.headers), data=message.data)
