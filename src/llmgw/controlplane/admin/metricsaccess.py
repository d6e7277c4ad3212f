"""Who may read the control plane's ``/metrics``: a caller who may read the whole cluster.

Its series name every model, project and node of the cluster (``llmgw_replicas{model=...}``,
``llmgw_gateway_requests_total{project=...}``), so ``/metrics`` on the HTTP port answers only
the admin token or a user's token with a viewer's role (or higher) at the cluster; any other
live token is refused (403) rather than shown a filtered page: a scrape is the cluster's
whole picture or nothing. Without a token it is 401. A Prometheus on a trusted network can
scrape without a token on an address of its own instead (``http.metrics_address``: then the
HTTP port answers ``/metrics`` 404, saying where it is). docs/metrics.md says the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.controlplane.admin.callers import Callers
from llmgw.controlplane.api.state import WRONG_TOKEN
from llmgw.core.tenancy import CLUSTER, Action

METRICS_PATH = "/metrics"

TOKEN_HINT = (
    "scrape with 'Authorization: Bearer <token>': the token in admin.token beside server.yaml, or a "
    "token of a user with a viewer's role at the cluster ('llmgw ctl user role USER viewer'); "
    "Prometheus reads it from a file (authorization.credentials_file), or set http.metrics_address "
    "in server.yaml to serve /metrics without a token on an address of its own"
)


@dataclass(frozen=True, slots=True)
class MetricsRefusal:
    """Why a ``/metrics`` request is not answered: its status, message and hint."""

    status: int
    message: str
    hint: str


def metrics_refusal(callers: Callers, authorization: str, elsewhere: str = "") -> MetricsRefusal | None:
    """None when the ``Authorization`` header may read ``/metrics`` on the HTTP port; else why not.

    ``elsewhere``: the address ``/metrics`` is served on instead (``http.metrics_address``), when set.
    """
    if elsewhere:
        return MetricsRefusal(
            404,
            f"/metrics is not served on this address: it is at http://{elsewhere}/metrics",
            "scrape that address (http.metrics_address in server.yaml), without a token",
        )
    caller = callers.identify(authorization)
    if caller is None:
        return MetricsRefusal(401, WRONG_TOKEN, TOKEN_HINT)
    permission = caller.may(Action.READ, CLUSTER)
    if not permission:
        return MetricsRefusal(
            403,
            f"{caller.name} may not read the cluster's metrics: {permission.reason}",
            "its series name every model and project of the cluster: scrape with the admin token or "
            "a token of a user with a viewer's role at the cluster ('llmgw ctl user role USER viewer')",
        )
    return None
