"""What only the leader does, started and stopped as leadership comes and goes.

:class:`LeaderDuties` is itself a supervised component: it follows
:class:`~llmgw.controlplane.lifecycle.leadership.Leadership`'s changes and

- starts the leader-only components (the reconciler) in the process
  supervisor when this control plane leads, and stops them when it no longer
  does (paused in a store outage, or standing by);
- lets every agent's stream go when it stands by, so the agents move to the
  new leader at once;
- tells the connected agents when the control planes there are change.

The leader-only components are registered with ``start=False``; their
failures are the supervisor's to log and restart, and ``/api/status`` shows
them stopped on a standby.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from llmgw.controlplane.lifecycle.leadership import LEADING, STANDBY, Leadership
from llmgw.runtime.supervising import Supervisor

log = logging.getLogger(__name__)


class AgentStreams(Protocol):
    """The agents' streams a leader serves (:class:`~llmgw.controlplane.nodes.sessions.NodeSessions`)."""

    def let_go(self) -> int: ...
    def tell_planes(self) -> None: ...


class LeaderDuties:
    """Runs ``components`` in ``supervisor`` while ``leadership`` leads; moves agents on when it does not."""

    def __init__(
        self, leadership: Leadership, supervisor: Supervisor, agents: AgentStreams, components: Sequence[str]
    ) -> None:
        self._leadership = leadership
        self._supervisor = supervisor
        self._agents = agents
        self._components = tuple(components)
        self._state = ""
        self._planes: frozenset[str] = frozenset()

    async def follow(self) -> None:
        """Apply every change of leadership until cancelled (a component of the process supervisor)."""
        leadership = self._leadership
        while True:
            seen = leadership.generation
            await self.apply()
            await leadership.wait_changed(leadership.round_s, seen)

    async def apply(self) -> None:
        """Bring the leader-only components and the agents' streams in line with the state now."""
        state = self._leadership.state
        if state == LEADING:
            for name in self._components:
                self._supervisor.start(name)
        else:
            for name in self._components:
                await self._supervisor.stop(name)
        if state == STANDBY and self._state not in ("", STANDBY):
            released = self._agents.let_go()
            if released:
                log.info("let %d agents go to the new leader", released)
        self._state = state
        planes = frozenset(p.agent_address for p in self._leadership.control_planes)
        if self._planes and planes != self._planes:
            self._agents.tell_planes()
        self._planes = planes
