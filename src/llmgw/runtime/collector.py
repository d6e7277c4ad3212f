"""The garbage collector's settings for a long-running server process.

CPython's cyclic collector runs its youngest generation every 700 allocations
by default; each run promotes what is alive at that moment (a reconcile
pass's working lists, a request's objects held across an ``await``) to the
older generations, and once enough has been promoted a full collection scans
everything the process holds. With a thousand nodes' state that took 75 to
300 ms and landed inside reconcile passes (bench/control_plane/README.md).

:func:`settle` is called once a process has built what it keeps for its whole
life: that is collected, then frozen (never scanned again), and the
thresholds are raised to :data:`THRESHOLDS`, so that short-lived objects die
by their reference counts before a collection sees them and few are promoted;
full collections become rare, and never scan the frozen start-up state.
``LLMGW_GC_THRESHOLDS`` (three integers, ``700,10,10`` being CPython's own)
overrides the thresholds.
"""

from __future__ import annotations

import gc
import os

from llmgw.errors import ConfigError

THRESHOLDS = (20_000, 20, 100)
"""Allocations before a young collection; young collections before a middle one; middle ones before a
full one (which CPython also defers until a quarter of what it last kept is new)."""

ENVIRONMENT = "LLMGW_GC_THRESHOLDS"


def thresholds(environ: dict[str, str] | None = None) -> tuple[int, int, int]:
    """The thresholds to use: :data:`THRESHOLDS`, or ``LLMGW_GC_THRESHOLDS`` when set."""
    text = (os.environ if environ is None else environ).get(ENVIRONMENT, "").strip()
    if not text:
        return THRESHOLDS
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 3 or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise ConfigError(
            f"{ENVIRONMENT}={text!r} is not three positive integers",
            hint=f"set it like '700,10,10' (CPython's defaults) or unset it for {THRESHOLDS}",
        )
    return int(parts[0]), int(parts[1]), int(parts[2])


def settle(environ: dict[str, str] | None = None) -> tuple[int, int, int]:
    """Collect and freeze what the process holds now, and set the thresholds; the thresholds set."""
    chosen = thresholds(environ)
    gc.collect()
    gc.freeze()
    gc.set_threshold(*chosen)
    return chosen
