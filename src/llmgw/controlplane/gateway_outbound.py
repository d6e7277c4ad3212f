"""What a gateway tells its control plane, handed to the follower of its state.

The control plane's gateway and each gateway worker's tell the same four
things (:class:`~llmgw.gateway.outbound.GatewayOutbound`); both hand them to
the part that follows their state: the control plane's
:class:`~llmgw.controlplane.statestream.StateFollowing` (done at once while
it leads, sent to the leader otherwise) and a worker's
:class:`~llmgw.controlplane.localchannel.WorkerFollowing` (sent to its
control plane). A replica wanted or failed goes as a request; usage and the
models kept in use go as the follower sums them.

The follower is built after the gateway (it follows the gateway's feed), so
it is bound once it exists (:meth:`FollowerOutbound.bind`); until then what
the gateway tells is dropped with a warning (no request is served before).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from llmgw.gateway.usage import UsageRecord

log = logging.getLogger(__name__)


class Follower(Protocol):
    """The follower's side: requests to the leader, usage and models in use."""

    def request(self, request: dict[str, Any]) -> None: ...

    def usage(self, record: UsageRecord) -> None: ...

    def used(self, model: str) -> None: ...


class _Unbound:
    def request(self, request: dict[str, Any]) -> None:
        log.warning("the gateway told %s before its follower was built: dropped", request.get("kind"))

    def usage(self, record: UsageRecord) -> None:
        log.warning("the gateway told usage before its follower was built: dropped")

    def used(self, model: str) -> None:
        return None


class FollowerOutbound:
    """A :class:`~llmgw.gateway.outbound.GatewayOutbound` whose calls go to a :class:`Follower`."""

    __slots__ = ("_follower",)

    def __init__(self) -> None:
        self._follower: Follower = _Unbound()

    def bind(self, follower: Follower) -> None:
        """From now on every call goes to ``follower``."""
        self._follower = follower

    def replica_wanted(self, model: str) -> None:
        self._follower.request({"kind": "wanted", "model": model})

    def model_used(self, model: str) -> None:
        self._follower.used(model)

    def usage(self, record: UsageRecord) -> None:
        self._follower.usage(record)

    def replica_failed(self, replica_id: str, reason: str) -> None:
        self._follower.request({"kind": "replica_failed", "replica_id": replica_id, "reason": reason})
