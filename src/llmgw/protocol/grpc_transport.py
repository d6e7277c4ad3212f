"""The agent stream over gRPC: bidirectional streaming, mutual TLS, keepalive pings.

The control plane runs an :class:`AgentServer`; each agent connects with a
:class:`GrpcConnector`. Both present certificates from the cluster's CA, and a
silently dead peer is noticed within keepalive time + timeout (5 s + 3 s).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc import aio

from llmgw.core.relays import RelayChunk, RelayPeer, RelayRequest
from llmgw.errors import ChannelClosed, ConfigError, NotFound, NotLeader, Unauthorized
from llmgw.pki.authority import serves
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol import agent_pb2_grpc as pb_grpc
from llmgw.protocol.channels import ControlChannel
from llmgw.protocol.relays import (
    decode_relay_chunk,
    decode_relay_request,
    encode_relay_chunk,
    encode_relay_request,
)

log = logging.getLogger(__name__)

SERVER_NAME = "llmgw-control-plane"
"""The DNS name every control plane certificate carries; agents check it instead of the address they dial."""

KEEPALIVE_TIME_MS = 5000
KEEPALIVE_TIMEOUT_MS = 3000
BLOB_CHUNK = 1 << 20

_CLIENT_OPTIONS = [
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.ssl_target_name_override", SERVER_NAME),
    ("grpc.max_receive_message_length", 16 << 20),
    ("grpc.enable_retries", 0),
]
_SERVER_OPTIONS = [
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 4000),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.max_send_message_length", 16 << 20),
]


@dataclass(frozen=True)
class TlsFiles:
    """The cluster CA and this process's own certificate and key."""

    ca: Path
    cert: Path
    key: Path

    def read(self) -> tuple[bytes, bytes, bytes]:
        try:
            return self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes()
        except OSError as error:
            raise ConfigError(
                f"cannot read TLS file {error.filename}: {error.strerror}",
                "run 'llmgw server init' (control plane) or copy the node's certificates into place",
            ) from None


SessionHandler = Callable[[ControlChannel], Awaitable[None]]
BlobProvider = Callable[[str, int], AsyncIterator[bytes]]
RelayHandler = Callable[[RelayPeer, RelayRequest], AsyncIterator[RelayChunk]]
"""Answers a relayed HTTP request, given who sent it (by its certificate)."""


def _common_name(context: aio.ServicerContext) -> str:  # type: ignore[type-arg,unused-ignore]
    names = context.auth_context().get("x509_common_name") or [b"?"]
    return str(names[0].decode())


def _relay_peer(context: aio.ServicerContext) -> RelayPeer:  # type: ignore[type-arg,unused-ignore]
    """The caller by its certificate: a control plane's is issued for server use, a node's is not."""
    pem = (context.auth_context().get("x509_pem_cert") or [b""])[0]
    return RelayPeer(_common_name(context), serves(pem))


class _ServerChannel:
    """The control plane's side of one agent's gRPC stream."""

    def __init__(self, context: aio.ServicerContext) -> None:  # type: ignore[type-arg,unused-ignore]
        self._context = context
        self._closed = False
        self._peer = _common_name(context)

    @property
    def peer(self) -> str:
        return self._peer

    async def send(self, message: pb.ControlMessage) -> None:
        if self._closed:
            raise ChannelClosed(f"the stream to {self._peer} is closed", "the agent reconnects")
        try:
            await self._context.write(message)
        except (grpc.RpcError, RuntimeError) as error:
            self._closed = True
            raise ChannelClosed(
                f"the stream to {self._peer} ended: {error}", "the agent reconnects"
            ) from None

    async def receive(self) -> pb.AgentMessage:
        if self._closed:
            raise ChannelClosed(f"the stream from {self._peer} is closed", "the agent reconnects")
        try:
            message = await self._context.read()
        except (grpc.RpcError, RuntimeError) as error:
            self._closed = True
            raise ChannelClosed(
                f"the stream from {self._peer} ended: {error}", "the agent reconnects"
            ) from None
        if message is aio.EOF:
            self._closed = True
            raise ChannelClosed(f"{self._peer} closed its stream", "the agent reconnects")
        return message  # type: ignore[no-any-return]

    async def close(self) -> None:
        self._closed = True


class _Servicer(pb_grpc.AgentServiceServicer):
    def __init__(self, handler: SessionHandler, blobs: BlobProvider, relay: RelayHandler | None) -> None:
        self._handler = handler
        self._blobs = blobs
        self._relay = relay

    async def Relay(self, request, context):  # type: ignore[no-untyped-def]
        relay = self._relay
        if relay is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this control plane relays nothing")
            return
        first = True
        try:
            async for chunk in relay(_relay_peer(context), decode_relay_request(request)):
                first = False
                yield encode_relay_chunk(chunk)
        except Unauthorized as error:
            if first:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{error.message}; {error.hint}")
            raise
        except NotLeader as error:
            if first:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{error.message}; {error.hint}")
            raise

    async def Connect(self, request_iterator, context):  # type: ignore[no-untyped-def]
        await self._handler(_ServerChannel(context))

    async def FetchBlob(self, request, context):  # type: ignore[no-untyped-def]
        first = True
        try:
            async for data in self._blobs(request.sha256, request.offset):
                yield pb.BlobChunk(data=data, size=0)
                first = False
        except NotFound as error:
            if first:
                await context.abort(grpc.StatusCode.NOT_FOUND, str(error))
            raise


class AgentServer:
    """The control plane's gRPC server for agents."""

    def __init__(
        self,
        handler: SessionHandler,
        blobs: BlobProvider,
        tls: TlsFiles,
        host: str,
        port: int,
        relay: RelayHandler | None = None,
    ) -> None:
        self._handler = handler
        self._blobs = blobs
        self._relay = relay
        self._tls = tls
        self._address = f"{host}:{port}"
        self._server: aio.Server | None = None
        self.port = 0

    async def start(self) -> int:
        ca, cert, key = self._tls.read()
        credentials = grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=ca, require_client_auth=True
        )
        server = aio.server(options=_SERVER_OPTIONS)
        pb_grpc.add_AgentServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _Servicer(self._handler, self._blobs, self._relay), server
        )
        self.port = server.add_secure_port(self._address, credentials)
        if not self.port:
            raise ConfigError(
                f"cannot listen for agents on {self._address}",
                "another process holds the port: stop it or set agent_server.port in server.yaml",
            )
        await server.start()
        self._server = server
        return self.port

    async def stop(self) -> None:
        """Close at once: agents' streams end now, so they move to another control plane without delay."""
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None


class _ClientChannel:
    """The agent's side of its gRPC stream."""

    def __init__(self, channel: aio.Channel, call: aio.StreamStreamCall, target: str) -> None:  # type: ignore[type-arg,unused-ignore]
        self._channel = channel
        self._call = call
        self._target = target
        self._closed = False

    @property
    def peer(self) -> str:
        return self._target

    async def send(self, message: pb.AgentMessage) -> None:
        if self._closed:
            raise ChannelClosed(f"the stream to {self._target} is closed", "reconnecting")
        try:
            await self._call.write(message)
        except (grpc.RpcError, aio.UsageError, RuntimeError) as error:
            self._closed = True
            raise ChannelClosed(
                f"the stream to {self._target} ended: {_describe(error)}", "reconnecting"
            ) from None

    async def receive(self) -> pb.ControlMessage:
        if self._closed:
            raise ChannelClosed(f"the stream from {self._target} is closed", "reconnecting")
        try:
            message = await self._call.read()
        except (grpc.RpcError, aio.UsageError, RuntimeError) as error:
            self._closed = True
            raise ChannelClosed(
                f"the stream from {self._target} ended: {_describe(error)}", "reconnecting"
            ) from None
        if message is aio.EOF:
            self._closed = True
            raise ChannelClosed(f"{self._target} ended the stream", "reconnecting")
        return message  # type: ignore[no-any-return]

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._call.cancel()
        await self._channel.close(grace=None)


def _describe(error: BaseException) -> str:
    if isinstance(error, aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    return str(error) or type(error).__name__


class GrpcConnector:
    """Opens an agent's stream to one control plane."""

    def __init__(self, target: str, tls: TlsFiles) -> None:
        self.target = target
        self._tls = tls

    def _channel(self) -> aio.Channel:
        ca, cert, key = self._tls.read()
        credentials = grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key, certificate_chain=cert
        )
        return aio.secure_channel(self.target, credentials, options=_CLIENT_OPTIONS)

    async def connect(self, timeout_s: float = 10.0) -> _ClientChannel:
        """A stream to the control plane, once its channel is up; ChannelClosed when it cannot be reached."""
        channel = self._channel()
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout_s)
        except (TimeoutError, grpc.RpcError) as error:
            await channel.close(grace=None)
            raise ChannelClosed(
                f"cannot reach the control plane at {self.target} ({type(error).__name__})",
                "check that it runs and that this node's certificate comes from the cluster's CA",
            ) from None
        call = pb_grpc.AgentServiceStub(channel).Connect()  # type: ignore[no-untyped-call]
        return _ClientChannel(channel, call, self.target)

    async def fetch(self, sha256: str, offset: int = 0) -> AsyncIterator[bytes]:
        """A blob's bytes from the control plane's mirror, from ``offset``."""
        channel = self._channel()
        try:
            stream = pb_grpc.AgentServiceStub(channel).FetchBlob(  # type: ignore[no-untyped-call]
                pb.BlobRequest(sha256=sha256, offset=offset)
            )
            async for chunk in stream:
                yield chunk.data
        except aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND:
                raise NotFound(
                    error.details() or f"blob {sha256} not found", "import it with 'llmgw mirror import FILE'"
                ) from None
            raise ChannelClosed(
                f"fetching {sha256[:12]} from {self.target} failed: {_describe(error)}", "retrying"
            ) from None
        finally:
            await channel.close(grace=None)

    async def relay(self, request: RelayRequest, connect_s: float = 3.0) -> AsyncIterator[RelayChunk]:
        """Pass an HTTP request to the control plane at the target and stream its answer back.

        :class:`ChannelClosed` when it cannot be reached, :class:`NotLeader`
        when it does not lead, :class:`Unauthorized` when it refuses this
        process's certificate. One channel for this request only: a standby
        relaying many keeps one with :class:`RelayClient`.
        """
        channel = self._channel()
        try:
            async for chunk in _relay_over(channel, self.target, request, connect_s):
                yield chunk
        finally:
            await channel.close(grace=None)


class RelayClient:
    """A standby's relays to the leader, over one kept channel per control plane."""

    def __init__(self, tls: TlsFiles) -> None:
        self._tls = tls
        self._channels: dict[str, aio.Channel] = {}

    async def relay(
        self, target: str, request: RelayRequest, connect_s: float = 3.0
    ) -> AsyncIterator[RelayChunk]:
        """Like :meth:`GrpcConnector.relay`; a channel that failed is dropped and made anew next time."""
        kept = self._channels.get(target)
        channel: aio.Channel = kept if kept is not None else GrpcConnector(target, self._tls)._channel()
        self._channels[target] = channel
        try:
            async for chunk in _relay_over(channel, target, request, connect_s):
                yield chunk
        except ChannelClosed:
            if self._channels.get(target) is channel:
                del self._channels[target]
            await channel.close(grace=None)
            raise

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close(grace=None)


async def _relay_over(
    channel: aio.Channel, target: str, request: RelayRequest, connect_s: float
) -> AsyncIterator[RelayChunk]:
    try:
        await asyncio.wait_for(channel.channel_ready(), connect_s)
    except (TimeoutError, grpc.RpcError, aio.UsageError):
        # UsageError: another relay over this kept channel failed and closed it meanwhile.
        raise ChannelClosed(f"cannot reach the control plane at {target}", "waiting for a leader") from None
    try:
        stream = pb_grpc.AgentServiceStub(channel).Relay(  # type: ignore[no-untyped-call]
            encode_relay_request(request)
        )
        async for chunk in stream:
            yield decode_relay_chunk(chunk)
    except aio.UsageError:
        raise ChannelClosed(f"the channel to {target} closed under this relay", "retrying") from None
    except aio.AioRpcError as error:
        code = error.code()
        if code == grpc.StatusCode.PERMISSION_DENIED:
            raise Unauthorized(
                f"the control plane at {target} refused the relay: {error.details()}",
                "give this control plane a certificate with 'llmgw server add'",
            ) from None
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            raise NotLeader(f"{target} does not lead: {error.details()}", "waiting for a leader") from None
        raise ChannelClosed(f"relaying to {target} failed: {_describe(error)}", "retrying") from None
