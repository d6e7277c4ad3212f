"""Usage kept on the control plane's disk while the store is away, and given back to it later.

The usage writer spills its sums here when the store refuses them, or when
more keys and models are counted than it holds in memory: one JSON line per
:class:`~llmgw.store.usage.UsageEntry`, appended to ``usage-spill.jsonl`` in
the data directory and fsynced in batches (:meth:`UsageSpill.sync`, once per
write interval and whenever the store refused a write). What was synced
survives a crash.

Replaying moves the file aside (``usage-spill.replaying.jsonl``, so spills
that arrive meanwhile start a new file) and hands its entries to the store in
chunks with :meth:`~llmgw.store.usage.UsageLog.append_missing`, which skips
entries already stored: a process that dies mid-replay replays the file again
at its next start, and nothing is counted twice. The file is removed once
every entry is stored.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import IO, Protocol

from llmgw.store.usage import UsageEntry

log = logging.getLogger(__name__)

SPILL_FILE = "usage-spill.jsonl"
REPLAYING_FILE = "usage-spill.replaying.jsonl"
REPLAY_CHUNK = 500
"""Entries stored per transaction when replaying."""


class ReplaySink(Protocol):
    """Where spilled entries go back: :class:`llmgw.store.usage.UsageLog`."""

    async def append_missing(self, entries: Sequence[UsageEntry]) -> int: ...


class UsageSpill:
    """An append-only file of usage entries under ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / SPILL_FILE
        self.replaying = directory / REPLAYING_FILE
        self._file: IO[str] | None = None
        self._unsynced = False
        self.spilled = 0
        """Entries this process spilled so far."""

    def waiting(self) -> bool:
        """Whether entries wait on disk for the store."""
        return self.replaying.exists() or (self.path.exists() and self.path.stat().st_size > 0)

    def write(self, entries: Sequence[UsageEntry]) -> None:
        """Append ``entries`` (synced to disk at the next :meth:`sync`)."""
        if not entries:
            return
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write("".join(_line(e) for e in entries))
        self._unsynced = True
        self.spilled += len(entries)

    def sync(self) -> None:
        """Make what was written so far survive a crash (one fsync for everything since the last)."""
        if self._file is not None and self._unsynced:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._unsynced = False

    def close(self) -> None:
        if self._file is not None:
            self.sync()
            self._file.close()
            self._file = None

    async def replay(self, sink: ReplaySink) -> int:
        """Give the spilled entries to the store; how many it did not hold yet.

        Raises the store's error (the rest stays on disk for the next replay).
        """
        stored = 0
        if not self.replaying.exists():
            if not self.waiting():
                return 0
            self.close()
            os.replace(self.path, self.replaying)
        entries = list(_read(self.replaying))
        for start in range(0, len(entries), REPLAY_CHUNK):
            stored += await sink.append_missing(entries[start : start + REPLAY_CHUNK])
        self.replaying.unlink()
        log.info("usage: %d entries kept on disk while the store was away are stored", stored)
        if self.waiting():  # spilled while this replay ran
            stored += await self.replay(sink)
        return stored


def _line(entry: UsageEntry) -> str:
    record = {
        "at": entry.at.isoformat(),
        "key_id": entry.key_id,
        "model": entry.model,
        "requests": entry.requests,
        "failed": entry.failed,
        "prompt_tokens": entry.prompt_tokens,
        "completion_tokens": entry.completion_tokens,
        "duration_ms": entry.duration_ms,
        "place": entry.place,
        "streamed": entry.streamed,
        "ttft_ms": entry.ttft_ms,
        "generation_ms": entry.generation_ms,
        "refused": entry.refused,
        "cached_tokens": entry.cached_tokens,
        "cost": entry.cost,
    }
    return json.dumps(record, separators=(",", ":")) + "\n"


def _read(path: Path) -> Iterator[UsageEntry]:
    """The entries of a spill file; a line cut short by a crash (never synced) is left out."""
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            try:
                record = json.loads(line)
                yield UsageEntry(
                    at=datetime.fromisoformat(record["at"]),
                    key_id=record["key_id"],
                    model=record["model"],
                    requests=int(record["requests"]),
                    failed=int(record["failed"]),
                    prompt_tokens=int(record["prompt_tokens"]),
                    completion_tokens=int(record["completion_tokens"]),
                    duration_ms=int(record["duration_ms"]),
                    place=str(record.get("place", "")),  # lines spilled before places were kept have none
                    streamed=int(record.get("streamed", 0)),
                    ttft_ms=int(record.get("ttft_ms", 0)),
                    generation_ms=int(record.get("generation_ms", 0)),
                    refused=int(record.get("refused", 0)),
                    cached_tokens=int(record.get("cached_tokens", 0)),
                    cost=float(record.get("cost", 0.0)),
                )
            except (ValueError, KeyError, TypeError) as error:
                log.warning("usage: %s line %d is not an entry, left out: %s", path, number, error)
