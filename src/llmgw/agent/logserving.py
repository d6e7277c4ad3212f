"""Answering the control plane's requests for a shard's log (``llmgw ctl logs``).

A request gets the shard's last lines at once; one that follows gets each
new line after, in batches, until the control plane cancels it or the
session ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from llmgw.agent.engineoutput import ShardLog
from llmgw.core.agentstream import AgentMessage
from llmgw.core.shardlogs import LogLines, LogRequest

BATCH_LINES = 500


class LogServing:
    """Serves LogRequests from shards' logs; answers go out through ``send``."""

    def __init__(
        self, node_id: str, log_of: Callable[[str], ShardLog | None], send: Callable[[AgentMessage], None]
    ) -> None:
        self._node_id = node_id
        self._log_of = log_of
        self._send = send
        self._following: dict[str, asyncio.Task[None]] = {}

    def _answer(self, request_id: str, lines: list[str], *, end: bool = False, error: str = "") -> None:
        self._send(LogLines(request_id=request_id, lines=tuple(lines), end=end, error=error))

    def handle(self, request: LogRequest) -> None:
        if request.cancel:
            task = self._following.pop(request.request_id, None)
            if task is not None:
                task.cancel()
            return
        shard_log = self._log_of(request.replica_id)
        if shard_log is None:
            self._answer(
                request.request_id,
                [],
                end=True,
                error=f"node {self._node_id} runs no shard {request.replica_id}",
            )
            return
        queue = shard_log.follow() if request.follow else None
        last = shard_log.last(request.lines)
        for start in range(0, max(len(last), 1), BATCH_LINES):  # one answer at least, empty or not
            self._answer(request.request_id, last[start : start + BATCH_LINES])
        if queue is None:
            self._answer(request.request_id, [], end=True)
            return
        task = asyncio.create_task(self._follow(request.request_id, shard_log, queue))
        self._following[request.request_id] = task
        task.add_done_callback(lambda _: self._following.pop(request.request_id, None))

    async def _follow(self, request_id: str, shard_log: ShardLog, queue: asyncio.Queue[str]) -> None:
        try:
            while True:
                lines = [await queue.get()]
                while not queue.empty() and len(lines) < BATCH_LINES:
                    lines.append(queue.get_nowait())
                self._answer(request_id, lines)
        finally:
            shard_log.unfollow(queue)

    def cancel_all(self) -> None:
        """Stop following for every request (the session ended)."""
        for task in list(self._following.values()):
            task.cancel()
        self._following.clear()
