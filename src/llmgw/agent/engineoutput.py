"""Engine output: each process writes its own file; the agent follows it into the shard's log.

An engine writes stdout and stderr to a file in its shard's directory
(mode 0600, opened with ``O_APPEND``), never to a pipe of the agent's, so an
engine outlives an agent restart without writing into a pipe nobody reads.
The agent follows the file into the shard's log: the last lines kept in
memory for ``llmgw ctl logs``, handed to whoever follows. An adopted engine's
file is read from the start. A file past its size limit is emptied in place
(the engine's ``O_APPEND`` writes then continue at its new end).

Secrets (the replica's key) never leave through the output: every
occurrence is overwritten with as many ``*`` in the file itself, at the
place it was written (so offsets and the engine's appends are unchanged),
and blanked in the lines handed to the log. An engine that prints its key
(SGLang's ``server_args=ServerArgs(..., api_key=...)``) leaves it on disk for
one follow interval at most, and never past the moment its shard is
reported ready (the supervisor reads the file once more before that).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

FOLLOW_INTERVAL_S = 0.5
KEPT_LINES = 2000
"""Lines of a shard's log kept in memory."""
MAX_LINE = 64 * 1024


def blanked(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every secret in it replaced by as many ``*``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "*" * len(secret))
    return text


def open_output(path: Path) -> int:
    """A descriptor a new engine process writes its output to: created empty, 0600, appended to."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    os.fchmod(descriptor, 0o600)
    return descriptor


class ShardLog:
    """The shard's log: its engines' lines, the last ones kept, new ones handed to followers."""

    def __init__(self, kept: int = KEPT_LINES) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=kept)
        self._followers: set[asyncio.Queue[str]] = set()

    def add(self, line: str) -> None:
        self.lines.append(line)
        for queue in self._followers:
            queue.put_nowait(line)

    def last(self, count: int) -> list[str]:
        return list(self.lines)[-count:] if count > 0 else []

    def follow(self) -> asyncio.Queue[str]:
        queue: asyncio.Queue[str] = asyncio.Queue()
        self._followers.add(queue)
        return queue

    def unfollow(self, queue: asyncio.Queue[str]) -> None:
        self._followers.discard(queue)


class OutputFollower:
    """Reads one process's output file into a shard's log, emptying it past ``max_bytes``.

    ``secrets`` are blanked out of the file, in place, and out of the log's lines.
    """

    def __init__(
        self,
        path: Path,
        shard_log: ShardLog,
        max_bytes: int,
        name: str = "",
        secrets: tuple[str, ...] = (),
    ) -> None:
        self.path = path
        self._log = shard_log
        self._max_bytes = max_bytes
        self._name = name or path.parent.name
        self._secrets = tuple(secret.encode() for secret in secrets if secret)
        self._offset = 0
        self._partial = b""
        self._carry = b""
        """The last bytes read (one short of the longest secret): a secret may span two reads."""
        self.blanked = 0
        """Secrets overwritten in the file."""
        self.emptied = 0
        """Times the file was emptied for passing its limit."""

    def poll(self) -> int:
        """Read what was written since the last poll; returns the lines added to the log."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return 0
        if size < self._offset:  # emptied by someone else: start again at its new end
            self._offset = 0
            self._carry = b""
        added = 0
        if size > self._offset:
            start = self._offset
            with self.path.open("rb") as handle:
                handle.seek(start)
                data = handle.read(size - start)
            self._offset += len(data)
            self._blank_in_file(start, data)
            added = self._take(data)
        if self._offset > self._max_bytes:
            os.truncate(self.path, 0)
            self._offset = 0
            self._carry = b""
            self.emptied += 1
            log.info(
                "shard %s: engine output passed %d bytes; emptied %s", self._name, self._max_bytes, self.path
            )
        return added

    def _blank_in_file(self, start: int, data: bytes) -> None:
        """Overwrite each secret in the bytes just read (from file offset ``start``) where it lies."""
        if not self._secrets:
            return
        window = self._carry + data
        base = start - len(self._carry)
        places = []
        for secret in self._secrets:
            at = window.find(secret)
            while at != -1:
                places.append((base + at, secret))
                at = window.find(secret, at + len(secret))
        kept = max(len(secret) for secret in self._secrets) - 1
        self._carry = window[max(0, len(window) - kept) :] if kept > 0 else b""
        if not places:
            return
        descriptor = os.open(self.path, os.O_WRONLY)
        try:
            for offset, secret in places:
                os.pwrite(descriptor, b"*" * len(secret), offset)
        finally:
            os.close(descriptor)
        self.blanked += len(places)

    def _take(self, data: bytes) -> int:
        joined = self._partial + data
        for secret in self._secrets:
            joined = joined.replace(secret, b"*" * len(secret))
        lines = joined.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_LINE:
            lines.append(self._partial)
            self._partial = b""
        for line in lines:
            self._log.add(line.decode(errors="replace").rstrip("\r"))
        return len(lines)

    def flush(self) -> None:
        """Read the rest of the file and hand on an unfinished last line (the process ended)."""
        self.poll()
        if self._partial:
            self._log.add(self._partial.decode(errors="replace"))
            self._partial = b""

    async def run(self, interval_s: float = FOLLOW_INTERVAL_S) -> None:
        """Follow until cancelled."""
        try:
            while True:
                try:
                    self.poll()
                except OSError as error:
                    log.warning("shard %s: cannot read %s: %s", self._name, self.path, error)
                await asyncio.sleep(interval_s)
        finally:
            with contextlib.suppress(OSError):
                self.flush()
