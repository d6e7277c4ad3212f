"""The agent's (and a standby's) side of the gRPC transport: streams, kept channels, connecting.

Each agent connects with a :class:`GrpcConnector` presenting a certificate
from the cluster's CA; :class:`KeptChannels` keeps an agent's TLS channels
from one stream to the next; :class:`RelayClient` relays HTTP to the leader.
The server side and what both sides share are in
:mod:`llmgw.protocol.grpc_transport`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterable, AsyncIterator

import grpc
from grpc import aio

from llmgw.core.relays import RelayChunk, RelayRequest
from llmgw.errors import ChannelClosed, NotFound, Unauthorized
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol import agent_pb2_grpc as pb_grpc
from llmgw.protocol.channels import StateChannel
from llmgw.protocol.grpc_relaying import KeptRelayChannels, relay_over
from llmgw.protocol.grpc_relaying import describe as _describe
from llmgw.protocol.grpc_transport import (
    _CLIENT_OPTIONS,
    CLOSE_GRACE_S,
    TlsFiles,
    _frame,
    _StreamChannel,
    _unframe,
)

log = logging.getLogger(__name__)


class _ClientChannel(_StreamChannel):
    """The agent's side of its gRPC stream."""

    def __init__(
        self,
        channel: aio.Channel,
        call: aio.StreamStreamCall,  # type: ignore[type-arg,unused-ignore]
        target: str,
        kept: KeptChannels | None = None,
    ) -> None:
        self._channel = channel
        self._call = call
        self._kept = kept
        """Where the channel is kept for the next stream (None: closed with this stream)."""
        super().__init__(target, "reconnecting")

    async def _read(self) -> object:
        return await self._call.read()

    async def _write(self, message: object) -> None:
        await self._call.write(message)

    async def send(self, message: pb.AgentMessage) -> None:
        await self._send(message)

    async def receive(self) -> pb.ControlMessage:
        return await self._receive()  # type: ignore[return-value]

    async def close(self) -> None:
        """End the stream: say so to the control plane, give it a moment to read what came before, then go."""
        if self._end_here():
            self._why = f"the stream with {self._peer} was closed here"
            with contextlib.suppress(grpc.RpcError, aio.UsageError, RuntimeError, TimeoutError):
                async with asyncio.timeout(CLOSE_GRACE_S):
                    await self._call.done_writing()
                    self._finished = await self._call.code() is grpc.StatusCode.OK
            self._call.cancel()
            self._reader.cancel()
        if self._kept is not None and self._kept.keeps(self._peer, self._channel, self._finished):
            return  # the channel serves the agent's next stream to this control plane
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._channel.close(grace=None), CLOSE_GRACE_S)


class _ClientStateChannel(_ClientChannel):
    """A standby's side of its GatewayState stream to the leader."""

    async def send(self, message: bytes) -> None:  # type: ignore[override]
        await self._send(_frame(message))

    async def receive(self) -> bytes:  # type: ignore[override]
        return _unframe(await self._receive())


class KeptChannels:
    """An agent's TLS channels, one per control plane, kept from one stream to the next.

    During a failover a standby that knows of no leader is asked again and again; over a
    kept channel each try is a new stream, not a new TLS handshake (a thousand nodes'
    handshakes twice a second took the standby's CPU just as it took the lease). A
    channel that fails (its control plane gone) or cannot be made ready in time is
    closed and forgotten, so the next try builds a new one from the TLS files as they
    are then.
    """

    def __init__(self, tls: TlsFiles) -> None:
        self._tls = tls
        self._channels: dict[str, aio.Channel] = {}
        self.made = 0
        """Channels made (each a TLS handshake), for the tests and the benchmark."""

    async def connect(self, target: str, timeout_s: float = 10.0) -> _ClientChannel:
        """A new stream to the control plane at ``target``, over its kept channel when it has one."""
        channel = self._channels.get(target)
        if channel is None or not _usable(channel):
            if channel is not None:
                await self._drop(target, channel)
            channel = GrpcConnector(target, self._tls).channel()
            self._channels[target] = channel
            self.made += 1
        try:
            return await GrpcConnector(target, self._tls).open(channel, timeout_s, self)
        finally:
            if self._channels.get(target) is channel and not _usable(channel):
                self._channels.pop(target, None)

    def keeps(self, target: str, channel: aio.Channel, finished: bool) -> bool:
        """Whether ``channel``, a stream over it just ended, stays for the next stream to ``target``:
        only when the control plane ``finished`` the stream cleanly (a standby's answer) and the
        channel is well; a stream that failed, or that the agent gave up on, takes its channel along."""
        if finished and self._channels.get(target) is channel and _usable(channel):
            return True
        if self._channels.get(target) is channel:
            del self._channels[target]
        return False

    async def _drop(self, target: str, channel: aio.Channel) -> None:
        if self._channels.get(target) is channel:
            del self._channels[target]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(channel.close(grace=None), CLOSE_GRACE_S)

    async def close(self) -> None:
        """Close every kept channel (the agent stops)."""
        for target, channel in list(self._channels.items()):
            await self._drop(target, channel)


async def _ready_or_refused(channel: aio.Channel) -> None:
    """Wait until ``channel`` is up; ConnectionRefusedError as soon as its first try fails (nothing
    listens there, or the handshake was refused), rather than the whole timeout: an agent whose
    leader died moves on to the next control plane at once."""
    state = channel.get_state(try_to_connect=True)
    tried = False
    while state is not grpc.ChannelConnectivity.READY:
        if state is grpc.ChannelConnectivity.TRANSIENT_FAILURE or (
            tried and state is grpc.ChannelConnectivity.IDLE
        ):
            raise ConnectionRefusedError("the connection failed")
        if state is grpc.ChannelConnectivity.SHUTDOWN:
            raise ConnectionRefusedError("the channel was closed")
        tried = tried or state is grpc.ChannelConnectivity.CONNECTING
        await channel.wait_for_state_change(state)
        state = channel.get_state(try_to_connect=True)


def _usable(channel: aio.Channel) -> bool:
    """A channel that may carry another stream: not shut down, not failing to connect."""
    state = channel.get_state(try_to_connect=False)
    return state not in (grpc.ChannelConnectivity.SHUTDOWN, grpc.ChannelConnectivity.TRANSIENT_FAILURE)


class GrpcConnector:
    """Opens an agent's stream to one control plane."""

    def __init__(self, target: str, tls: TlsFiles) -> None:
        self.target = target
        self._tls = tls

    def channel(self) -> aio.Channel:
        """A new TLS channel to the target, from the TLS files as they are now."""
        ca, cert, key = self._tls.read()
        credentials = grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key, certificate_chain=cert
        )
        return aio.secure_channel(self.target, credentials, options=_CLIENT_OPTIONS)

    async def connect(self, timeout_s: float = 10.0) -> _ClientChannel:
        """A stream to the control plane, once its channel is up; ChannelClosed when it cannot be reached."""
        return await self.open(self.channel(), timeout_s)

    async def open(
        self, channel: aio.Channel, timeout_s: float, kept: KeptChannels | None = None
    ) -> _ClientChannel:
        """A stream over ``channel`` once it is up (closed when it is not, and ChannelClosed raised);
        with ``kept``, the channel outlives the stream there."""
        try:
            await asyncio.wait_for(_ready_or_refused(channel), timeout_s)
            call = pb_grpc.AgentServiceStub(channel).Connect()  # type: ignore[no-untyped-call]
        except Exception as error:  # whatever gRPC raises here (UsageError, RuntimeError from
            # a channel that changed under the wait), the control plane cannot be reached on it
            with contextlib.suppress(Exception):
                await channel.close(grace=None)
            raise ChannelClosed(
                f"cannot reach the control plane at {self.target} ({type(error).__name__})",
                "check that it runs and that this node's certificate comes from the cluster's CA",
            ) from None
        return _ClientChannel(channel, call, self.target, kept)

    async def gateway_state(self, timeout_s: float = 1.0) -> StateChannel:
        """A GatewayState stream to the control plane at the target (a standby's to the leader);
        ChannelClosed when it cannot be reached, and from ``receive`` when it refuses."""
        channel = self.channel()
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout_s)
        except (TimeoutError, grpc.RpcError) as error:
            await channel.close(grace=None)
            raise ChannelClosed(
                f"cannot reach the control plane at {self.target} ({type(error).__name__})", "retrying"
            ) from None
        call = pb_grpc.AgentServiceStub(channel).GatewayState()  # type: ignore[no-untyped-call]
        return _ClientStateChannel(channel, call, self.target)

    async def fetch(self, sha256: str, offset: int = 0) -> AsyncIterator[bytes]:
        """A blob's bytes from the control plane's mirror, from ``offset``."""
        channel = self.channel()
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
            if error.code() == grpc.StatusCode.PERMISSION_DENIED:
                raise Unauthorized(
                    f"{self.target} refused blob {sha256[:12]}…: {error.details()}",
                    "a node fetches only the files of the shards its control plane sent it",
                ) from None
            raise ChannelClosed(
                f"fetching {sha256[:12]} from {self.target} failed: {_describe(error)}", "retrying"
            ) from None
        finally:
            await channel.close(grace=None)

    async def relay(
        self, request: RelayRequest, body: AsyncIterable[bytes] | None = None, connect_s: float = 3.0
    ) -> AsyncIterator[RelayChunk]:
        """Pass an HTTP request (and its body, streamed) to the control plane at the target and
        stream its answer back.

        :class:`ChannelClosed` when it cannot be reached or the call breaks,
        :class:`NotLeader` when it does not lead, :class:`Unauthorized` when
        it refuses this process's certificate; whatever ``body`` raises
        cancels the call and is raised here. One channel for this request
        only: a standby relaying many keeps one with :class:`RelayClient`.
        """
        channel = self.channel()
        try:
            async for chunk in relay_over(channel, self.target, request, body, connect_s):
                yield chunk
        finally:
            await channel.close(grace=None)


class RelayClient(KeptRelayChannels):
    """A standby's relays to the leader over kept channels, with this process's certificates."""

    def __init__(self, tls: TlsFiles) -> None:
        super().__init__(lambda target: GrpcConnector(target, tls).channel())
