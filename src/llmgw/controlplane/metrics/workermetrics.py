"""``/metrics`` behind gateway workers: the control plane's metrics with its workers' gateway samples added.

Each worker sends the samples of its gateway metrics (the families named
``llmgw_gateway_*`` and ``llmgw_adapter_*``: counters, histograms, gauges)
over the local channel every second, and when asked (:func:`gateway_samples`).
The control plane's ``/metrics`` (:func:`serve_metrics`) asks every worker
for its samples as of now (waiting a second at most), then renders its own registry
with each worker's last samples added to the sample of the same name and
labels (:class:`SummedRegistry`), so a scrape sees the whole port's requests
as it did with one process. A worker's samples go when its channel ends: its
counters drop then, which Prometheus reads as a counter reset. ``_created``
samples stay the control plane's own. It wants the same token as without
workers (:mod:`~llmgw.controlplane.admin.metricsaccess`); :func:`metrics_only` serves it
without one on ``http.metrics_address``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from llmgw.controlplane.admin.admission import refuse_two_authorizations, two_authorizations
from llmgw.controlplane.admin.metricsaccess import METRICS_PATH, MetricsRefusal
from llmgw.controlplane.serving.httpserving import ASGIApp

PREFIXES = ("llmgw_gateway_", "llmgw_adapter_")
"""The families a worker's gateway fills; the rest of a worker's process is not the port's."""

SUFFIXES = ("", "_total", "_bucket", "_count", "_sum")
"""A family's sample names: its own name with one of these."""

Samples = list[list[Any]]
"""``[name, labels, value]`` per sample, as JSON carries them."""


def gateway_samples(registry: Any = REGISTRY) -> Samples:
    """This process's gateway samples."""
    out: Samples = []
    for family in registry.collect():
        if family.name.startswith(PREFIXES):
            out.extend([s.name, s.labels, s.value] for s in family.samples if not s.name.endswith("_created"))
    return out


class SummedRegistry:
    """A registry's families with other processes' samples added (what ``generate_latest`` renders)."""

    def __init__(self, registry: Any, others: Callable[[], Iterable[Samples]]) -> None:
        self._registry = registry
        self._others = others

    def collect(self) -> Iterator[Metric]:
        extra: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for samples in self._others():
            for name, labels, value in samples:
                key = (str(name), tuple(sorted((str(k), str(v)) for k, v in labels.items())))
                extra[key] = extra.get(key, 0.0) + float(value)
        for family in self._registry.collect():
            if extra and family.name.startswith(PREFIXES):
                summed: list[Sample] = []
                for s in family.samples:
                    key = (s.name, tuple(sorted(s.labels.items())))
                    summed.append(s._replace(value=s.value + extra.pop(key)) if key in extra else s)
                names = {family.name + suffix for suffix in SUFFIXES}
                for key in [k for k in extra if k[0] in names]:
                    summed.append(Sample(key[0], dict(key[1]), extra.pop(key)))
                family.samples = summed
            yield family


Refusing = Callable[[str], MetricsRefusal | None]
"""Why a request with this ``Authorization`` header may not read ``/metrics`` (None: it may)."""


async def _refresh_none() -> None:
    return None


def _authorization(scope: dict[str, Any]) -> str:
    for name, value in scope["headers"]:
        if name == b"authorization":
            return str(value.decode("latin-1"))
    return ""


async def _send(send: Any, status: int, body: bytes, content_type: bytes, head_only: bool) -> None:
    head = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if status == 401:
        head.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": b"" if head_only else body})


async def _render(view: Any, refresh: Callable[[], Awaitable[Any]], send: Any, head_only: bool) -> None:
    await refresh()
    body = generate_latest(view)  # any object with collect() will do
    await _send(send, 200, body, CONTENT_TYPE_LATEST.encode(), head_only)


async def _refuse(refusal: MetricsRefusal, send: Any) -> None:
    body = json.dumps({"error": {"message": refusal.message, "hint": refusal.hint}}).encode()
    await _send(send, refusal.status, body, b"application/json", False)


def serve_metrics(
    app: ASGIApp, view: Any, refresh: Callable[[], Awaitable[Any]], refusal: Refusing
) -> ASGIApp:
    """``GET /metrics`` answered from ``view`` once ``refresh`` (the workers' fresh samples) returned,
    to a request ``refusal`` lets through (the others get its answer); everything else to ``app``."""

    async def metrics(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == METRICS_PATH and scope["method"] in ("GET", "HEAD"):
            if two_authorizations(scope):  # as the admission layer behind answers every other path
                await refuse_two_authorizations(send)
                return
            refused = refusal(_authorization(scope))
            if refused is not None:
                await _refuse(refused, send)
                return
            await _render(view, refresh, send, scope["method"] == "HEAD")
            return
        await app(scope, receive, send)

    return metrics


def metrics_only(view: Any = REGISTRY, refresh: Callable[[], Awaitable[Any]] = _refresh_none) -> ASGIApp:
    """``GET /metrics`` from ``view`` without a token, 404 for anything else: what
    ``http.metrics_address`` serves, for a Prometheus on a trusted network."""

    async def metrics(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == METRICS_PATH and scope["method"] in ("GET", "HEAD"):
            await _render(view, refresh, send, scope["method"] == "HEAD")
            return
        missing = MetricsRefusal(
            404, f"nothing at {scope['path']} here", "this address serves /metrics alone"
        )
        await _refuse(missing, send)

    return metrics
