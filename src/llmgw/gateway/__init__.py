"""llmgw.gateway: the OpenAI-compatible ``/v1`` data path.

The control plane builds one :class:`Gateway`, passing it the
:class:`GatewayOutbound` it tells (a replica wanted, usage, a replica
failed), keeps its key ring, catalog view and replica table current through
``gateway.feed``, and mounts :meth:`Gateway.asgi_app`. The gateway never
touches the store.
"""

from llmgw.gateway.app import Gateway
from llmgw.gateway.catalog_view import GatewayCatalog, ModelEntry
from llmgw.gateway.keys import KeyEntry, KeyRing, hash_secret
from llmgw.gateway.outbound import GatewayOutbound
from llmgw.gateway.replicas import Lease, ReplicaEndpoint, ReplicaTable
from llmgw.gateway.settings import GatewaySettings
from llmgw.gateway.usage import UsageRecord

__all__ = [
    "Gateway",
    "GatewayCatalog",
    "GatewayOutbound",
    "GatewaySettings",
    "KeyEntry",
    "KeyRing",
    "Lease",
    "ModelEntry",
    "ReplicaEndpoint",
    "ReplicaTable",
    "UsageRecord",
    "hash_secret",
]
