"""The agent stream over gRPC: bidirectional streaming, mutual TLS, keepalive pings.

The control plane runs an :class:`AgentServer`; each agent connects with a
:class:`~llmgw.protocol.grpc_client.GrpcConnector` (the client's side is in
:mod:`llmgw.protocol.grpc_client`). Both present certificates from the cluster's CA, and a
silently dead peer is noticed within keepalive time + timeout (5 s + 3 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc import aio

from llmgw.core.relays import IncomingRelay, RelayChunk, RelayPeer
from llmgw.errors import ChannelClosed, ConfigError, NotFound, NotLeader, Unauthorized
from llmgw.pki.authority import serves
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol import agent_pb2_grpc as pb_grpc
from llmgw.protocol.channels import ControlChannel, StateChannel
from llmgw.protocol.grpc_relaying import RelayCall
from llmgw.protocol.grpc_relaying import describe as _describe
from llmgw.protocol.relays import encode_relay_chunks

log = logging.getLogger(__name__)

SERVER_NAME = "llmgw-control-plane"
"""The DNS name every control plane certificate carries; agents check it instead of the address they dial."""

KEEPALIVE_TIME_MS = 5000
KEEPALIVE_TIMEOUT_MS = 3000
BLOB_CHUNK = 1 << 20
MAX_MESSAGE_BYTES = 16 << 20
"""The largest message either side sends or takes, set on both so no default (gRPC's 4 MiB receive)
applies unseen. Every message stays far below it: blob chunks are 1 MiB and relayed bodies cross in
pieces of 256 KiB (``protocol/relays.py``), so this bounds a broken peer, never a body's size."""

_CLIENT_OPTIONS = [
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.ssl_target_name_override", SERVER_NAME),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.enable_retries", 0),
]
_SERVER_OPTIONS = [
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 4000),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
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
BlobProvider = Callable[[RelayPeer, str, int], AsyncIterator[bytes]]
"""A blob's bytes for ``(caller, sha256, offset)``: the caller by its certificate (a node, or a control
plane pulling into its own mirror). NotFound for a blob the mirror lacks, Unauthorized for one that
caller may not fetch (answered PERMISSION_DENIED)."""
RelayHandler = Callable[[RelayPeer, IncomingRelay], AsyncIterator[RelayChunk]]
"""Answers a relayed HTTP request, given who sent it (by its certificate), reading the request only
once it accepts the sender."""
StateHandler = Callable[[RelayPeer, StateChannel], Awaitable[None]]
"""Serves a GatewayState call, given who called (by its certificate); the call ends when it returns."""


def _common_name(context: aio.ServicerContext) -> str:  # type: ignore[type-arg,unused-ignore]
    names = context.auth_context().get("x509_common_name") or [b"?"]
    return str(names[0].decode())


_END = object()
"""Put in a channel's inbox when its stream has ended (the reason is kept on the channel)."""


def _refuse(context: aio.ServicerContext, code: grpc.StatusCode, details: str) -> None:  # type: ignore[type-arg,unused-ignore]
    """End a relay call before its answer with ``code`` (once what the caller sent was taken in:
    :meth:`RelayCall.take_in_refused`)."""
    context.set_code(code)
    context.set_details(details)


def _relay_peer(context: aio.ServicerContext) -> RelayPeer:  # type: ignore[type-arg,unused-ignore]
    """The caller by its certificate: a control plane's is issued for server use, a node's is not."""
    pem = (context.auth_context().get("x509_pem_cert") or [b""])[0]
    return RelayPeer(_common_name(context), serves(pem))


INBOX = 64
"""Messages read ahead of ``receive``; a full inbox stops the reading (flow control then holds the peer)."""

CLOSE_GRACE_S = 1.0
"""How long an agent closing its stream waits for the control plane to take in what it sent before."""


class _StreamChannel:
    """Both sides of a gRPC stream: a task reads ahead into an inbox, so that closing can wake a receive.

    ``receive`` raises :class:`ChannelClosed` once the stream has ended, from
    either side, after the messages that came before the end; ``send`` raises
    it once this side has closed or seen the end (the contract of
    :mod:`llmgw.protocol.channels`).
    """

    def __init__(self, peer: str, hint: str) -> None:
        self._peer = peer
        self._hint = hint
        self._closed = False
        self._why = f"the stream with {peer} is closed"
        self._finished = False
        """Whether the peer ended the stream cleanly (all read, no error): a standby that answered."""
        self._inbox: asyncio.Queue[object] = asyncio.Queue(INBOX)
        self._ended = asyncio.Event()
        """Set once the stream has ended: this side closed it, or the reader saw its end."""
        self._reader = asyncio.create_task(self._read_ahead())
        self._writing = asyncio.Lock()
        """One write at a time, in the order asked: gRPC refuses a second write while one is pending
        (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS), and the reconciler, the session and telemetry all send."""

    @property
    def peer(self) -> str:
        return self._peer

    async def _read(self) -> object:
        raise NotImplementedError

    async def _write(self, message: object) -> None:
        raise NotImplementedError

    async def _read_ahead(self) -> None:
        try:
            while True:
                message = await self._read()
                if message is aio.EOF:
                    self._why = f"{self._peer} ended the stream"
                    self._finished = True
                    break
                await self._inbox.put(message)
        except (grpc.RpcError, aio.UsageError, RuntimeError) as error:
            self._why = f"the stream with {self._peer} ended: {_describe(error)}"
        except asyncio.CancelledError:  # closed here, or the call cancelled under the read
            self._ended.set()
            with contextlib.suppress(asyncio.QueueFull):
                self._inbox.put_nowait(_END)
            raise
        self._ended.set()
        await self._inbox.put(_END)

    def _closed_error(self) -> ChannelClosed:
        return ChannelClosed(self._why, self._hint)

    async def _send(self, message: object) -> None:
        if self._closed:
            raise self._closed_error()
        try:
            async with self._writing:
                if self._closed:
                    raise self._closed_error()
                await self._write(message)
        except (grpc.RpcError, aio.UsageError, RuntimeError) as error:
            self._closed = True
            self._why = f"the stream to {self._peer} ended: {_describe(error)}"
            raise self._closed_error() from None

    async def _receive(self) -> object:
        if self._closed:
            raise self._closed_error()
        item = await self._inbox.get()
        if item is _END:
            self._closed = True
            raise self._closed_error()
        return item

    def _end_here(self) -> bool:
        """Mark this side closed and wake a receive waiting on it; False when it was closed already.

        The reader goes on: on the agent's side, cancelling a read would cancel
        the call before the control plane has read what was sent.
        """
        if self._closed and self._ended.is_set():
            return False
        self._closed = True
        self._ended.set()
        with contextlib.suppress(asyncio.QueueFull):
            self._inbox.put_nowait(_END)  # a waiting receive means an empty inbox: this always fits then
        return True


class _ServerChannel(_StreamChannel):
    """The control plane's side of one agent's gRPC stream; closing it (or the agent's end) ends the call."""

    def __init__(self, context: aio.ServicerContext) -> None:  # type: ignore[type-arg,unused-ignore]
        self._context = context
        super().__init__(_common_name(context), "the agent reconnects")

    async def _read(self) -> object:
        return await self._context.read()

    async def _write(self, message: object) -> None:
        await self._context.write(message)

    async def send(self, message: pb.ControlMessage) -> None:
        await self._send(message)

    async def receive(self) -> pb.AgentMessage:
        return await self._receive()  # type: ignore[return-value]

    async def close(self) -> None:
        if self._end_here():
            self._why = f"the stream with {self._peer} was closed here"
            self._reader.cancel()

    async def ended(self) -> None:
        await self._ended.wait()


def _frame(frame: bytes) -> pb.StateFrame:
    return pb.StateFrame(json=frame)


def _unframe(message: object) -> bytes:
    frame: bytes = message.json  # type: ignore[attr-defined]
    return frame


class _ServerStateChannel(_ServerChannel):
    """The leader's side of a standby's GatewayState stream: the state protocol's frames in StateFrames."""

    async def send(self, message: bytes) -> None:  # type: ignore[override]
        await self._send(_frame(message))

    async def receive(self) -> bytes:  # type: ignore[override]
        return _unframe(await self._receive())


class _Servicer(pb_grpc.AgentServiceServicer):
    def __init__(
        self,
        handler: SessionHandler,
        blobs: BlobProvider,
        relay: RelayHandler | None,
        state: StateHandler | None = None,
    ) -> None:
        self._handler = handler
        self._blobs = blobs
        self._relay = relay
        self._state = state
        self._sessions: set[asyncio.Future[None]] = set()
        """Handlers still running after their stream ended (kept so they are not collected)."""

    async def Relay(self, request_iterator, context):  # type: ignore[no-untyped-def]
        """Answer one relayed request; each is a call of its own, so its failure ends no other."""
        relay = self._relay
        if relay is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this control plane relays nothing")
            return
        peer = _relay_peer(context)
        incoming = RelayCall(context, peer.name)
        first = True
        try:
            async for chunk in relay(peer, incoming):
                for message in encode_relay_chunks(chunk):
                    first = False
                    yield message
        except Unauthorized as error:
            if not first:
                raise
            await incoming.take_in_refused()
            _refuse(context, grpc.StatusCode.PERMISSION_DENIED, f"{error.message}; {error.hint}")
        except NotLeader as error:
            if not first:
                raise
            await incoming.take_in_refused()
            _refuse(context, grpc.StatusCode.FAILED_PRECONDITION, f"{error.message}; {error.hint}")

    async def GatewayState(self, request_iterator, context):  # type: ignore[no-untyped-def]
        """Serve a standby's state stream; refusals end the call with PERMISSION_DENIED or
        FAILED_PRECONDITION before anything is sent."""
        serve = self._state
        if serve is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this control plane streams no state")
            return
        peer = _relay_peer(context)
        channel = _ServerStateChannel(context)
        try:
            await serve(peer, channel)
        except Unauthorized as error:
            _refuse(context, grpc.StatusCode.PERMISSION_DENIED, f"{error.message}; {error.hint}")
        except NotLeader as error:
            _refuse(context, grpc.StatusCode.FAILED_PRECONDITION, f"{error.message}; {error.hint}")
        finally:
            await channel.close()

    async def Connect(self, request_iterator, context):  # type: ignore[no-untyped-def]
        """Run the session handler; the call ends when it returns or when the stream has ended."""
        channel = _ServerChannel(context)
        handler: asyncio.Future[None] = asyncio.ensure_future(self._handler(channel))
        ended = asyncio.ensure_future(channel.ended())
        try:
            await asyncio.wait({handler, ended}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            handler.cancel()
            await channel.close()
            raise
        finally:
            ended.cancel()
        if handler.done():
            await channel.close()
            handler.result()
        else:  # the agent ended the stream: the handler takes in what came before, then learns of the end
            self._sessions.add(handler)
            handler.add_done_callback(self._session_done)

    def _session_done(self, handler: asyncio.Future[None]) -> None:
        self._sessions.discard(handler)
        if not handler.cancelled() and handler.exception() is not None:
            log.error("a session handler failed after its stream ended", exc_info=handler.exception())

    async def FetchBlob(self, request, context):  # type: ignore[no-untyped-def]
        first = True
        try:
            async for data in self._blobs(_relay_peer(context), request.sha256, request.offset):
                yield pb.BlobChunk(data=data, size=0)
                first = False
        except NotFound as error:
            if first:
                await context.abort(grpc.StatusCode.NOT_FOUND, str(error))
            raise
        except Unauthorized as error:
            if first:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{error.message}; {error.hint}")
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
        state: StateHandler | None = None,
    ) -> None:
        self._handler = handler
        self._blobs = blobs
        self._relay = relay
        self._state = state
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
            _Servicer(self._handler, self._blobs, self._relay, self._state), server
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
