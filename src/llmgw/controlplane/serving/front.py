"""The first thing the HTTP port calls: a leader's ``/v1`` straight to the gateway.

Everything the port serves goes through the edge the control plane builds
(:func:`~llmgw.controlplane.parts.build_edges`): the admin API's token and body
limit (:class:`~llmgw.controlplane.admin.admission.Admission`), a standby's
relaying to the leader (:class:`~llmgw.controlplane.serving.relaying.StandbyForwarding`),
then the gateway or the admin app by path. On a control plane that serves, a
gateway path passes each of those unchanged, so :func:`gateway_first` calls the
gateway at once for it: one call on the request path instead of four. Every
other request, and every request while this plane does not serve, takes the
whole edge.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmgw.controlplane.serving.httpserving import ASGIApp
from llmgw.gateway.paths import gateway_path


def gateway_first(gateway: ASGIApp, edge: ASGIApp, serving: Callable[[], bool]) -> ASGIApp:
    """``gateway`` for a gateway path while ``serving()``; ``edge`` (which ends in the same
    ``gateway`` for it) for everything else."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and gateway_path(scope["path"]) and serving():
            await gateway(scope, receive, send)
        else:
            await edge(scope, receive, send)

    return app
