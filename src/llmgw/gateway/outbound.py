"""The one way out: what the gateway tells whoever runs it, the twin of :mod:`llmgw.gateway.feeding`.

The control plane changes what the gateway knows through
:class:`~llmgw.gateway.feeding.GatewayFeed`; what the gateway has to say back
goes through one :class:`GatewayOutbound` object passed to it:

- a request wants a model with no ready replica (start one, on demand);
- a request a replica answered has ended (its usage), and the catalog model it kept in use
  (an adapter's base model, an environment's entry);
- a key's request was refused before any replica took it (its usage: the status, no tokens);
- a replica could not be reached (the control plane checks it and replaces it).

The control plane implements it while leading and hands the calls to its
leader otherwise; a gateway worker hands them to its control plane
(``controlplane/serving/gatewaybuilding.py``'s ``Outbox``); tests record them
(:class:`llmgw.testing.gateway_doubles.RecordingOutbound`).

Every method is called on the event loop and must return at once (hand the
work to a queue or a task). The gateway calls them through
:class:`Telling`, which keeps a failing implementation from failing the
request: the failure is logged, the request goes on.
"""

from __future__ import annotations

import logging
from typing import Protocol

from llmgw.gateway.feeding import GatewayFeed
from llmgw.gateway.replicas import ReplicaTable
from llmgw.gateway.usage import UsageRecord

log = logging.getLogger(__name__)


class GatewayOutbound(Protocol):
    """What the gateway tells the control plane (every call returns at once)."""

    def replica_wanted(self, model: str) -> None:
        """A request wants ``model`` and no replica of it is ready: start one (on demand)."""

    def model_used(self, model: str) -> None:
        """A request kept catalog model ``model`` in use (for idle time and scaling to zero)."""

    def usage(self, record: UsageRecord) -> None:
        """A key's request has ended: what it used (written to the store). A request no replica
        took (refused by a check, a limit, or for want of a replica) has no replica and no tokens."""

    def replica_failed(self, replica_id: str, reason: str) -> None:
        """The replica could not be reached: check it and replace it if it is gone."""


class NoOutbound:
    """Tells nobody: a gateway run alone (tests of its own parts, a benchmark)."""

    def replica_wanted(self, model: str) -> None:
        return None

    def model_used(self, model: str) -> None:
        return None

    def usage(self, record: UsageRecord) -> None:
        return None

    def replica_failed(self, replica_id: str, reason: str) -> None:
        return None


class Telling:
    """The gateway's side of :class:`GatewayOutbound`: each call shielded from the request.

    :meth:`request_ended` is what a request says when it ends: the time to its
    first token goes into the replica table (autoscaling reads it), then the
    catalog model it kept in use and its usage are told.
    """

    __slots__ = ("_feed", "_outbound", "_replicas")

    def __init__(self, outbound: GatewayOutbound, feed: GatewayFeed, replicas: ReplicaTable) -> None:
        self._outbound = outbound
        self._feed = feed
        self._replicas = replicas

    def replica_wanted(self, model: str) -> None:
        try:
            self._outbound.replica_wanted(model)
        except Exception:
            log.exception("telling that model %s wants a replica failed", model)

    def request_ended(self, record: UsageRecord) -> None:
        try:
            served = self._feed.served_model(record.model)
            if record.ttft_s is not None:
                self._replicas.saw_ttft(served, record.ttft_s)
            outbound = self._outbound
            outbound.model_used(served)
            outbound.usage(record)
        except Exception:
            log.exception("telling the usage of %s failed", record)

    def request_refused(self, record: UsageRecord) -> None:
        """A key's request refused before a replica took it: its usage only (no model kept in use)."""
        try:
            self._outbound.usage(record)
        except Exception:
            log.exception("telling the usage of %s failed", record)

    def replica_failed(self, replica_id: str, reason: str) -> None:
        try:
            self._outbound.replica_failed(replica_id, reason)
        except Exception:
            log.exception("telling that replica %s failed", replica_id)
