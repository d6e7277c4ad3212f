"""Weights no shard uses are removed, oldest first, once the weights folder holds too much.

Every ``interval_s`` (and once when the agent starts) the collector looks at
``weights/<sha256>/``, the folders :mod:`llmgw.agent.installing` fetches
into. A folder's last use is its modification time: each pass sets it to now
for every file a shard of this node uses (running, starting, adopted), so the
time survives a restart of the agent. When the folders together hold more
than ``weights_max_gb``, the ones no shard uses and unused for at least
``weights_keep_hours`` are removed, the longest unused first, until the total
is within the limit again; each removal is logged with its reason.

A file is removed under the installer's lock for its sha256, and only if no
shard uses it at that moment: a shard that starts meanwhile waits for the
removal and fetches the file again, never a file half gone. A model's folder
of links (``weights/models/<digest>/``) goes once no shard uses it and one of
its files has lost its last other link (its blob was removed).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from llmgw.agent.weightfiles import MODELS_DIR, folder_digest
from llmgw.core.shards import ShardSpec
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

INTERVAL_S = 600.0
"""How often the weights folder is looked at."""
GB = 10**9

_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Kept:
    """One fetched file's folder, ``weights/<sha256>/``."""

    sha256: str
    size: int
    """Bytes of everything in it (the file, its digest record, a partial)."""
    last_used: float
    """Wall time (s) a shard last used it: the folder's modification time."""


@dataclass(frozen=True)
class Removal:
    kept: Kept
    reason: str


def used_files(specs: Iterable[ShardSpec]) -> tuple[set[str], set[str]]:
    """(sha256 of every file, digest of every model folder) that ``specs`` use."""
    files: set[str] = set()
    folders: set[str] = set()
    for spec in specs:
        files |= {spec.weights_sha256, spec.projector_sha256, *(f.sha256 for f in spec.files)}
        if spec.weights_format == "safetensors":
            main = (spec.weights_filename or "model.gguf", spec.weights_sha256)
            folders.add(folder_digest([main, *((f.filename, f.sha256) for f in spec.files)]))
        for adapter in spec.adapters:
            files |= {adapter.sha256, *(f.sha256 for f in adapter.files)}
            if adapter.files:
                main = (adapter.filename, adapter.sha256)
                folders.add(folder_digest([main, *((f.filename, f.sha256) for f in adapter.files)]))
    files.discard("")
    return files, folders


def choose(kept: Iterable[Kept], used: set[str], now: float, keep_s: float, max_bytes: int) -> list[Removal]:
    """What to remove: unused for ``keep_s`` or longer, oldest first, until within ``max_bytes``."""
    kept = list(kept)
    total = sum(k.size for k in kept)
    if total <= max_bytes:
        return []
    removals: list[Removal] = []
    idle = sorted(
        (k for k in kept if k.sha256 not in used and now - k.last_used >= keep_s), key=lambda k: k.last_used
    )
    for candidate in idle:
        if total <= max_bytes:
            break
        hours = (now - candidate.last_used) / 3600
        reason = (
            f"no shard used it for {hours:.1f} h and the weights folder held {total / GB:.1f} GB, "
            f"over weights_max_gb {max_bytes / GB:g}"
        )
        removals.append(Removal(candidate, reason))
        total -= candidate.size
    return removals


def scan(weights_dir: Path) -> list[Kept]:
    """Every ``weights/<sha256>/`` folder with its size and last use; blocking."""
    found: list[Kept] = []
    if not weights_dir.is_dir():
        return found
    for entry in weights_dir.iterdir():
        if not _SHA256.fullmatch(entry.name) or not entry.is_dir():
            continue
        try:
            size = sum(f.stat().st_size for f in entry.rglob("*") if f.is_file() and not f.is_symlink())
            found.append(Kept(entry.name, size, entry.stat().st_mtime))
        except OSError:
            continue  # removed meanwhile
    return found


def mark_used(weights_dir: Path, files: Iterable[str], now: float) -> None:
    """Set the last use of the folders of ``files`` to ``now``; blocking."""
    for sha in files:
        try:
            os.utime(weights_dir / sha, (now, now))
        except OSError:
            continue  # not fetched yet


def orphaned_folders(weights_dir: Path, used: set[str]) -> list[Path]:
    """Model folders no shard uses whose files lost their blob (last hard link, or a dangling link)."""
    models = weights_dir / MODELS_DIR
    if not models.is_dir():
        return []
    orphans = []
    for folder in models.iterdir():
        if folder.name in used or folder.name.startswith(".") or not folder.is_dir():
            continue
        files = [f for f in folder.rglob("*") if f.is_symlink() or f.is_file()]
        if any(not f.exists() or (not f.is_symlink() and f.stat().st_nlink < 2) for f in files):
            orphans.append(folder)
    return orphans


class WeightsCollector:
    """Removes unused weights past their keep time once the weights folder holds too much."""

    def __init__(
        self,
        weights_dir: Path,
        specs: Callable[[], Iterable[ShardSpec]],
        lock: Callable[[str], asyncio.Lock],
        *,
        keep_hours: float,
        max_gb: float,
        clock: Clock = SYSTEM_CLOCK,
        interval_s: float = INTERVAL_S,
    ) -> None:
        self._dir = weights_dir
        self._specs = specs
        self._lock = lock
        self._keep_s = keep_hours * 3600
        self._max_bytes = int(max_gb * GB)
        self._clock = clock
        self._interval_s = interval_s

    async def run(self) -> None:
        """Collect now and every interval until cancelled (a supervised component)."""
        while True:
            await self.collect()
            await self._clock.sleep(self._interval_s)

    async def collect(self) -> list[Removal]:
        """One pass: what was removed, each with its reason."""
        now = self._clock.time()
        used, _ = used_files(self._specs())
        await asyncio.to_thread(mark_used, self._dir, used, now)
        kept = await asyncio.to_thread(scan, self._dir)
        removed: list[Removal] = []
        for removal in choose(kept, used, now, self._keep_s, self._max_bytes):
            sha = removal.kept.sha256
            async with self._lock(sha):
                if sha in used_files(self._specs())[0]:
                    continue  # a shard started with it meanwhile
                await asyncio.to_thread(shutil.rmtree, self._dir / sha, True)
                log.info(
                    "removed weights %s… (%.1f GB): %s", sha[:12], removal.kept.size / GB, removal.reason
                )
                removed.append(removal)
        if removed:
            _, folders = used_files(self._specs())
            for folder in await asyncio.to_thread(orphaned_folders, self._dir, folders):
                await asyncio.to_thread(shutil.rmtree, folder, True)
                log.info(
                    "removed model folder %s: its weights were removed and no shard uses it", folder.name
                )
        return removed
