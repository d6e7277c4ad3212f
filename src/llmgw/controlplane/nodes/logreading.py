"""Reading a shard's log through its node's stream (``GET /api/replicas/{id}/logs``).

The control plane asks the node's agent with a LogRequest; the agent
answers with LogLines, the last lines at once and, while the caller follows,
each new line after. Answers are matched to their request by id. A request
that follows ends when the caller goes (a cancel goes down the stream) or
when the node's session ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable

from llmgw.core.shardlogs import LogLines, LogRequest
from llmgw.errors import ChannelClosed, LlmgwError, NotFound
from llmgw.protocol.links import ControlLink

ANSWER_TIMEOUT_S = 10.0
"""How long a node may take to answer a request for lines."""
ALIVE_CHECK_S = 2.0
"""How often a follower checks that the node's session is still the one asked."""


class LogRequests:
    """Requests for logs waiting on their nodes' answers."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Queue[LogLines]] = {}

    def deliver(self, answer: LogLines) -> None:
        """Hand an agent's LogLines to the request waiting for it (dropped when it is gone)."""
        queue = self._waiting.get(answer.request_id)
        if queue is not None:
            queue.put_nowait(answer)

    async def read(
        self,
        channel: ControlLink,
        replica_id: str,
        lines: int,
        follow: bool,
        attached: Callable[[], bool],
    ) -> AsyncIterator[list[str]]:
        """The replica's lines in batches; NotFound when the node runs no such shard.

        ``attached`` says whether the node's session is still ``channel``'s.
        """
        request_id = uuid.uuid4().hex
        queue: asyncio.Queue[LogLines] = asyncio.Queue()
        self._waiting[request_id] = queue
        request = LogRequest(request_id=request_id, replica_id=replica_id, lines=lines, follow=follow)
        try:
            await _send(channel, request)
            answered = False
            while True:
                try:
                    answer = await asyncio.wait_for(
                        queue.get(), ALIVE_CHECK_S if answered and follow else ANSWER_TIMEOUT_S
                    )
                except TimeoutError:
                    if answered and follow and attached():
                        continue
                    if not answered:
                        raise LlmgwError(
                            f"the node running {replica_id} did not answer for its log",
                            "check the node with 'llmgw ctl nodes' and try again",
                        ) from None
                    return
                answered = True
                if answer.error:
                    raise NotFound(answer.error, "see where each replica runs with 'llmgw ctl replicas'")
                yield list(answer.lines)
                if answer.end:
                    return
        finally:
            self._waiting.pop(request_id, None)
            if follow:
                with contextlib.suppress(LlmgwError):
                    await _send(channel, LogRequest(request_id=request_id, cancel=True))


async def _send(channel: ControlLink, request: LogRequest) -> None:
    try:
        await channel.send(request)
    except ChannelClosed:
        raise LlmgwError(
            "the node running that replica has gone", "check the node with 'llmgw ctl nodes'"
        ) from None
