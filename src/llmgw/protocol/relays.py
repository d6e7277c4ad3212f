"""Relayed HTTP requests and their answers' chunks, to and from the protocol's messages."""

from __future__ import annotations

from collections.abc import Iterable

from llmgw.core.relays import Headers, RelayChunk, RelayRequest
from llmgw.protocol import agent_pb2 as pb


def _encode_headers(headers: Headers) -> list[pb.HttpHeader]:
    return [pb.HttpHeader(name=name, value=value) for name, value in headers]


def _decode_headers(headers: Iterable[pb.HttpHeader]) -> Headers:
    return tuple((h.name, h.value) for h in headers)


def encode_relay_request(request: RelayRequest) -> pb.RelayRequest:
    return pb.RelayRequest(
        method=request.method, path=request.path, headers=_encode_headers(request.headers), body=request.body
    )


def decode_relay_request(message: pb.RelayRequest) -> RelayRequest:
    return RelayRequest(
        method=message.method, path=message.path, headers=_decode_headers(message.headers), body=message.body
    )


def encode_relay_chunk(chunk: RelayChunk) -> pb.RelayChunk:
    return pb.RelayChunk(status=chunk.status, headers=_encode_headers(chunk.headers), data=chunk.data)


def decode_relay_chunk(message: pb.RelayChunk) -> RelayChunk:
    return RelayChunk(status=message.status, headers=_decode_headers(message.headers), data=message.data)
