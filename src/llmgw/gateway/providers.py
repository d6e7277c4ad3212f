"""Providers as targets of the router: one entry in the replica table per provider model.

A catalog model served outside the cluster (:mod:`llmgw.core.providers`) is
routed as a cluster model is: its requests find its entry in the
:class:`~llmgw.gateway.replicas.ReplicaTable`, hold a lease while they are
answered and count their usage, under the same keys, tenancy and limits. The
entry is the provider's address and key; its ``capacity`` is the provider's
``max_concurrency``, a hard cap (a request over it waits ``request_wait_s`` for
a slot, then 503). The control plane feeds it with the catalog
(:meth:`~llmgw.gateway.feeding.GatewayFeed.catalog_replaced`): no node, agent or
health check is involved, and the load reader leaves it alone.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmgw.core.catalog import ModelDefinition
from llmgw.gateway.replicas import ReplicaEndpoint, ReplicaTable

REPLICA_PREFIX = "provider:"
"""The replica id of a provider model's entry is this and the model's name."""
ENGINE = "provider"
"""The engine an entry names: none of the cluster's (no adapters, no metrics, no /tokenize)."""


def provider_endpoint(model: ModelDefinition) -> ReplicaEndpoint | None:
    """The table's entry for ``model``; None when the cluster serves it."""
    provider = model.provider
    if provider is None:
        return None
    return ReplicaEndpoint(
        replica_id=REPLICA_PREFIX + model.name,
        model=model.name,
        base_url=provider.root,
        api_key=provider.key,
        capacity=provider.max_concurrency,
        engine=ENGINE,
        provider=provider,
    )


def is_provider(replica_id: str) -> bool:
    """Whether a replica id is a provider model's entry."""
    return replica_id.startswith(REPLICA_PREFIX)


def place_providers(table: ReplicaTable, models: Iterable[ModelDefinition]) -> None:
    """Make the table's provider entries those of ``models``: new ones added, changed ones updated
    (their requests in flight still counted), removed ones gone."""
    wanted = {e.replica_id: e for m in models if (e := provider_endpoint(m)) is not None}
    for endpoint in table.endpoints():
        if is_provider(endpoint.replica_id) and endpoint.replica_id not in wanted:
            table.remove(endpoint.replica_id)
    for replica_id, endpoint in wanted.items():
        if table.get(replica_id) != endpoint:
            table.set_ready(endpoint)
