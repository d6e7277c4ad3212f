"""How far each starting shard's files have come from the mirror, reported at most twice a second.

The installer says, per file (by sha256), how many of its bytes are on the
node: found there and checked, resumed from a partial, or as each chunk is
written. A shard's progress is the sum over its files (weights, the
repository's other files, projector, adapters), so two shards sharing a file
both count it. Each shard's report goes up at most once per ``interval_s`` on
the injected clock, with the rate since its previous report; a fetch that
takes less than that never reports at all::

    meters = FetchMeters(report, clock)
    meters.begin(spec.replica_id, shard_files(spec))
    meters.found(sha, bytes_already_there)  # a checked file, a resumed partial
    meters.advanced(sha, bytes_on_node)     # as chunks are written
    meters.end(spec.replica_id)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from llmgw.core.shards import FetchProgress, ShardSpec
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock

REPORT_INTERVAL_S = 0.5
"""At most two reports a second per shard."""

Report = Callable[[str, FetchProgress], None]
"""Called with (replica id, progress)."""


def shard_files(spec: ShardSpec) -> dict[str, int]:
    """Every file a shard fetches, size by sha256 (each once)."""
    files: dict[str, int] = {spec.weights_sha256: spec.weights_size}
    files.update((f.sha256, f.size) for f in spec.files)
    if spec.projector_sha256:
        files[spec.projector_sha256] = spec.projector_size
    for adapter in spec.adapters:
        files[adapter.sha256] = adapter.size
        files.update((f.sha256, f.size) for f in adapter.files)
    files.pop("", None)
    return files


@dataclass
class _Meter:
    files: dict[str, int]
    last_at: float
    last_done: int = 0


class FetchMeters:
    """Per-shard fetch progress, throttled to one report per ``interval_s`` per shard."""

    def __init__(self, report: Report, clock: Clock = SYSTEM_CLOCK, interval_s: float = REPORT_INTERVAL_S):
        self._report = report
        self._clock = clock
        self._interval_s = interval_s
        self._on_node: dict[str, int] = {}
        self._meters: dict[str, _Meter] = {}

    def begin(self, replica_id: str, files: dict[str, int]) -> None:
        """Start metering a shard's files (size by sha256); its first report comes one interval later."""
        self._meters[replica_id] = _Meter(dict(files), self._clock.monotonic())

    def end(self, replica_id: str) -> None:
        """Stop metering a shard (its files are all there, or it failed); forget files no shard meters."""
        self._meters.pop(replica_id, None)
        metered = {sha for meter in self._meters.values() for sha in meter.files}
        for sha in set(self._on_node) - metered:
            del self._on_node[sha]

    def found(self, sha256: str, on_node: int) -> None:
        """``on_node`` bytes of ``sha256`` were already on the node (checked, or a partial resumed):
        they count as done, not towards the rate."""
        before = self._on_node.get(sha256, 0)
        self._on_node[sha256] = on_node
        for meter in self._meters.values():
            size = meter.files.get(sha256)
            if size is not None:
                meter.last_done += min(on_node, size) - min(before, size)

    def advanced(self, sha256: str, on_node: int) -> None:
        """``on_node`` bytes of the file ``sha256`` are now on the node; reports the shards due one."""
        self._on_node[sha256] = on_node
        now: float | None = None
        for replica_id, meter in self._meters.items():
            if sha256 not in meter.files:
                continue
            now = self._clock.monotonic() if now is None else now
            elapsed = now - meter.last_at
            if elapsed < self._interval_s:
                continue
            done = self._done(meter)
            progress = FetchProgress(
                done=done, total=sum(meter.files.values()), bytes_per_s=(done - meter.last_done) / elapsed
            )
            meter.last_at, meter.last_done = now, done
            self._report(replica_id, progress)

    def _done(self, meter: _Meter) -> int:
        return sum(min(self._on_node.get(sha, 0), size) for sha, size in meter.files.items())

    def metering(self) -> Iterable[str]:
        """The replicas whose fetch is metered now."""
        return list(self._meters)
