"""Where the gateway's CPU goes, by layer: py-spy's collapsed stacks read into a cost per request.

``py-spy record --format raw`` writes one line per distinct stack,
``frame;frame;…;frame COUNT``, root first, each frame ``function (file:line)``
with ``file`` relative to its ``site-packages`` or the standard library's
directory. Each sample is given to one layer: walking from the leaf towards the
root, the first frame a layer claims (so ``json.loads`` called by
``gateway/bodies.py`` is the body's cost). The standard library's files are
claimed by no layer: a stack of only them and the loop is the event loop's, a
library's callback run by the loop is "other libraries".

A layer's CPU per request is its share of the samples times the cores the
process kept busy over the phase, over the requests per second it answered:
``share * cores / rps``, in microseconds.

    python bench/gateway/layers.py PROFILE --rps 1241 --cores 0.3
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # (layer, what it claims: a file prefix, or ``file#function prefix``); the first claiming a frame has it
    (
        "HTTP server: parsing, writing (uvicorn, httptools)",
        (
            "uvicorn/protocols/",
            "uvicorn/server",
            "httptools/",
            "h11/",
            "llmgw/controlplane/serving/httpserving.py#GuardedHttpProtocol.",
            "llmgw/controlplane/serving/headholding.py",
        ),
    ),
    (
        "ASGI layers before the gateway (proxy headers, admission, standby, prefix routing)",
        (
            "uvicorn/middleware/",
            "starlette/",
            "llmgw/controlplane/admin/admission.py",
            "llmgw/controlplane/serving/relaying.py",
            "llmgw/controlplane/serving/front.py",
            "llmgw/controlplane/serving/httpserving.py",
        ),
    ),
    (
        "gateway dispatch and answers",
        (
            "llmgw/gateway/app.py",
            "llmgw/gateway/gate.py",
            "llmgw/gateway/paths.py",
            "llmgw/gateway/api_errors.py",
            "llmgw/gateway/shaping.py",
        ),
    ),
    ("keys and access", ("llmgw/gateway/keys.py", "llmgw/gateway/access.py", "llmgw/core/tenancy.py")),
    ("limits", ("llmgw/gateway/limiting.py", "llmgw/core/limits.py", "llmgw/core/limitshares.py")),
    ("body parse and checks", ("llmgw/gateway/bodies.py", "llmgw/core/requestbounds.py", "orjson/")),
    (
        "routing (finding a replica, loads, prefixes, adapters)",
        (
            "llmgw/gateway/finding.py",
            "llmgw/gateway/routing.py",
            "llmgw/gateway/replicas.py",
            "llmgw/gateway/loads.py",
            "llmgw/gateway/adapters.py",
            "llmgw/core/routing.py",
            "llmgw/core/prefixes.py",
            "llmgw/core/kvblocks.py",
        ),
    ),
    (
        "upstream client (connections, request, response read)",
        ("llmgw/gateway/upstream.py", "llmgw/gateway/outbound.py"),
    ),
    (
        "forwarding and relay",
        ("llmgw/gateway/forwarding.py", "llmgw/gateway/exchange.py", "llmgw/gateway/leaving.py"),
    ),
    ("metrics", ("llmgw/gateway/metrics.py", "prometheus_client/")),
    (
        "store and the plane's own tasks (leadership, state sharing, usage writes)",
        (
            "llmgw/store/",
            "llmgw/controlplane/lifecycle/",
            "llmgw/controlplane/statesharing/",
            "sqlalchemy/",
            "aiosqlite/",
            "asyncpg/",
        ),
    ),
    ("usage", ("llmgw/gateway/usage.py", "llmgw/controlplane/accounting/", "llmgw/protocol/channels.py")),
    ("other llmgw", ("llmgw/",)),
    ("event loop and sockets (uvloop, asyncio)", ("uvloop/",)),
)
EVENT_LOOP = LAYERS[-1][0]
OTHER_LIBRARIES = "other libraries"
NO_FRAME = "no Python frame (native code, or a sample py-spy could not read)"

_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_STDLIB_TOP = re.compile(r"^(<[^>]+>|[A-Za-z_][A-Za-z0-9_]*(?:\.py)?)(/|$)")
_STDLIB_PACKAGES = frozenset(
    {"asyncio", "concurrent", "json", "logging", "email", "http", "urllib", "importlib", "collections",
     "encodings", "ctypes", "multiprocessing", "xml", "unittest", "sqlite3", "re", "zoneinfo"}
)  # fmt: skip


@dataclass(frozen=True)
class Layer:
    """One layer's part of a profile."""

    name: str
    samples: int
    share: float
    """Of every sample in the profile, 0 to 1."""
    us_per_request: float | None
    """CPU per request in microseconds; None when the rate or the cores are not known."""


def frame_file(frame: str) -> str:
    """The file a frame names: ``"f (llmgw/gateway/app.py:279)"`` → ``llmgw/gateway/app.py``."""
    return _parts(frame)[1]


def _parts(frame: str) -> tuple[str, str]:
    match = _FRAME.match(frame.strip())
    return (match.group("function"), match.group("file")) if match else ("", "")


def is_stdlib(file: str) -> bool:
    """Whether py-spy's short name for ``file`` is the standard library's (``asyncio/runners.py``)."""
    if file.startswith("<"):
        return True
    top = file.split("/", 1)[0]
    if "/" not in file:
        return top.endswith(".py") or top == ""
    return top in _STDLIB_PACKAGES


def layer_of(file: str, function: str = "") -> str | None:
    """The layer claiming a frame of ``function`` in ``file``, or None (the standard library, or a library no
    layer names)."""
    for name, claims in LAYERS:
        for claim in claims:
            path, _, prefix = claim.partition("#")
            if (file == path and function.startswith(prefix)) if prefix else file.startswith(path):
                return name
    return None


def attribute(stack: str) -> str:
    """The layer one sample's stack (root first, ``;`` between frames) is counted in."""
    frames = [frame for frame in stack.split(";") if frame.strip()]
    if not frames:
        return NO_FRAME
    libraries = False
    for frame in reversed(frames):
        function, file = _parts(frame)
        layer = layer_of(file, function)
        if layer == EVENT_LOOP and libraries:
            return OTHER_LIBRARIES  # a library's callback, run by the loop
        if layer is not None:
            return layer
        libraries = libraries or not is_stdlib(file)
    return OTHER_LIBRARIES if libraries else EVENT_LOOP


def read(lines: Iterable[str]) -> dict[str, int]:
    """Samples per layer from py-spy's raw (collapsed) output; a line not ``STACK COUNT`` is skipped."""
    counts: dict[str, int] = {}
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not count.isdigit():
            continue
        layer = attribute(stack)
        counts[layer] = counts.get(layer, 0) + int(count)
    return counts


def layers(counts: dict[str, int], rps: float | None = None, cores: float | None = None) -> list[Layer]:
    """Each layer's share (and CPU per request when ``rps`` and ``cores`` are known), the costliest first."""
    total = sum(counts.values())
    if total == 0:
        return []
    per_request = cores * 1e6 / rps if rps and cores is not None else None
    rows = [
        Layer(name, samples, samples / total, None if per_request is None else samples / total * per_request)
        for name, samples in counts.items()
    ]
    return sorted(rows, key=lambda row: (-row.samples, row.name))


def table(rows: list[Layer]) -> str:
    """The layers as a text table, with a total line."""
    out = [f"{'layer':<86} {'share':>6} {'µs/req':>7}"]
    for row in rows:
        us = "" if row.us_per_request is None else f"{row.us_per_request:.1f}"
        out.append(f"{row.name:<86} {row.share * 100:5.1f}% {us:>7}")
    known = [row.us_per_request for row in rows if row.us_per_request is not None]
    total = f"{sum(known):.1f}" if known else ""
    out.append(
        f"{'total (' + str(sum(row.samples for row in rows)) + ' samples)':<86} {'100%':>6} {total:>7}"
    )
    return "\n".join(out)


def figures(rows: list[Layer]) -> dict[str, dict[str, float]]:
    """The layers for the JSON line: ``{layer: {"share": …, "us": …}}``."""
    return {
        row.name: {"share": round(row.share, 4)}
        | ({} if row.us_per_request is None else {"us": round(row.us_per_request, 1)})
        for row in rows
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("profile", help="py-spy record --format raw output")
    parser.add_argument("--rps", type=float, help="requests per second over the profiled phase")
    parser.add_argument("--cores", type=float, help="cores the process kept busy over the phase")
    parser.add_argument("--json", action="store_true", help="print the layers as one JSON line instead")
    args = parser.parse_args()
    with open(args.profile, encoding="utf-8") as lines:
        rows = layers(read(lines), args.rps, args.cores)
    print(json.dumps(figures(rows)) if args.json else table(rows))


if __name__ == "__main__":
    main()
