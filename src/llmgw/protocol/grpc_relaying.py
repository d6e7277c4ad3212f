"""Relaying HTTP requests over gRPC: the standby's calls to the leader and the leader's side of them.

Each relayed request is a Relay call of its own, streaming both ways (see
``agent.proto``), so one that fails or is cancelled ends no other: the
standby keeps one channel per control plane and never closes it under the
calls still on it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass

import grpc
from grpc import aio

from llmgw.core.relays import RelayChunk, RelayRequest
from llmgw.errors import ChannelClosed, NotLeader, Unauthorized
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol import agent_pb2_grpc as pb_grpc
from llmgw.protocol.relays import (
    RELAY_END,
    decode_relay_chunk,
    decode_relay_head,
    encode_relay_body,
    encode_relay_head,
)


def describe(error: BaseException) -> str:
    """A gRPC error in words: its status and details."""
    if isinstance(error, aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    return str(error) or type(error).__name__


class RelayCall:
    """The leader's side of one Relay call, as an :class:`IncomingRelay`: reads only when asked."""

    def __init__(self, context: aio.ServicerContext, peer: str) -> None:  # type: ignore[type-arg,unused-ignore]
        self._context = context
        self._peer = peer
        self._first: pb.RelayRequest | None = None

    async def _next(self) -> pb.RelayRequest:
        try:
            message = await self._context.read()
        except (grpc.RpcError, aio.UsageError, RuntimeError) as error:
            raise ChannelClosed(
                f"the request relayed by {self._peer} broke off: {describe(error)}",
                "its client sends it again",
            ) from None
        if message is aio.EOF:
            raise ChannelClosed(
                f"{self._peer} ended the relayed request before its end", "its client sends it again"
            )
        return message  # type: ignore[no-any-return]

    async def head(self) -> RelayRequest:
        self._first = await self._next()
        return decode_relay_head(self._first)

    async def body(self) -> AsyncIterator[bytes]:
        message = self._first
        if message is None:
            raise RuntimeError("read the relayed request's head before its body")
        while True:
            if message.body:
                yield message.body
            if message.end:
                return
            message = await self._next()

    async def take_in_refused(self, messages: int = 4, within_s: float = 1.0) -> None:
        """Read what a refused caller already sent (a head and its end, as a rule) before the refusal
        goes out: a call ended with its request unread now and then reached the caller as INTERNAL
        rather than the refusal. Bounded: a refused caller's body is never read whole."""
        with contextlib.suppress(ChannelClosed, TimeoutError):
            async with asyncio.timeout(within_s):
                for _ in range(messages):
                    if (await self._next()).end:
                        return


class _Unreachable(ChannelClosed):
    """The channel did not come up: the kept one is dropped, so that the next relay dials afresh."""


@dataclass
class _Kept:
    channel: aio.Channel
    users: int = 0
    dropped: bool = False


class KeptRelayChannels:
    """A standby's relays to the leader, each a call of its own over one kept channel per control plane.

    A call that fails ends that relay alone: the channel stays for the others.
    Only a channel that does not come up is dropped (a fresh one dials at once
    rather than after gRPC's reconnect backoff), and closed once the relays
    still on it have ended.
    """

    def __init__(self, dial: Callable[[str], aio.Channel]) -> None:
        self._dial = dial
        self._channels: dict[str, _Kept] = {}

    async def relay(
        self,
        target: str,
        request: RelayRequest,
        body: AsyncIterable[bytes] | None = None,
        connect_s: float = 3.0,
    ) -> AsyncIterator[RelayChunk]:
        """Like :func:`relay_over`, over the kept channel to ``target``."""
        kept = self._channels.get(target)
        if kept is None:
            kept = self._channels[target] = _Kept(self._dial(target))
        kept.users += 1
        try:
            async for chunk in relay_over(kept.channel, target, request, body, connect_s):
                yield chunk
        except _Unreachable:
            if self._channels.get(target) is kept:
                del self._channels[target]
            kept.dropped = True
            raise
        finally:
            kept.users -= 1
            if kept.dropped and kept.users == 0:
                await kept.channel.close(grace=None)

    async def close(self) -> None:
        kept, self._channels = list(self._channels.values()), {}
        for one in kept:
            one.dropped = True
            await one.channel.close(grace=None)


async def relay_over(
    channel: aio.Channel,
    target: str,
    request: RelayRequest,
    body: AsyncIterable[bytes] | None,
    connect_s: float,
) -> AsyncIterator[RelayChunk]:
    """One Relay call: a task writes the request as its body comes; this reads the answer.

    :class:`ChannelClosed` when the control plane cannot be reached or the call
    breaks, :class:`NotLeader` when it does not lead, :class:`Unauthorized`
    when it refuses this process's certificate; whatever ``body`` raises
    cancels the call and is raised here.

    Leaving early (the consumer stops, or is cancelled) cancels the call, which
    the leader sees as its client going away.
    """
    try:
        await asyncio.wait_for(channel.channel_ready(), connect_s)
    except (TimeoutError, grpc.RpcError, aio.UsageError):
        # UsageError: the relay client was closed meanwhile.
        raise _Unreachable(f"cannot reach the control plane at {target}", "waiting for a leader") from None
    call = pb_grpc.AgentServiceStub(channel).Relay()  # type: ignore[no-untyped-call]
    writer = asyncio.create_task(_write_request(call, request, body))
    try:
        while True:
            try:
                message = await call.read()
            except asyncio.CancelledError:
                failure = _failure_of(writer)
                task = asyncio.current_task()
                if failure is not None and task is not None and not task.cancelling():
                    raise failure from None  # the body failed and cancelled the call
                raise
            if message is aio.EOF:
                return
            yield decode_relay_chunk(message)
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
        raise ChannelClosed(f"relaying to {target} failed: {describe(error)}", "retrying") from None
    finally:
        writer.cancel()
        call.cancel()
        await asyncio.wait({writer})


async def _write_request(
    call: aio.StreamStreamCall, request: RelayRequest, body: AsyncIterable[bytes] | None
) -> None:  # type: ignore[type-arg,unused-ignore]
    """Send the head, the body's chunks as they come (each write waits for flow control), then the end."""
    try:
        await call.write(encode_relay_head(request))
        if body is not None:
            async for data in body:
                for message in encode_relay_body(data):
                    await call.write(message)
        await call.write(RELAY_END)
        await call.done_writing()
    except (grpc.RpcError, aio.UsageError, asyncio.InvalidStateError):
        return  # the call ended: its reader learns how
    except BaseException:
        call.cancel()
        raise


def _failure_of(task: asyncio.Task[None]) -> BaseException | None:
    if not task.done() or task.cancelled():
        return None
    return task.exception()
