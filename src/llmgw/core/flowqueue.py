"""Flow control: the order in which requests waiting for a busy model are sent on, and which are refused.

When every replica of a model is busy, a request waits in the gateway (not in
an engine's first-come queue) in that model's :class:`FlowQueue`:

- **priority first**: a request of a higher :attr:`Waiting.priority` is sent
  before any of a lower one (0 is the lowest; :data:`DEFAULT_PRIORITY` for a
  request that names none);
- **then fairly between flows** (a flow is a project, or a key: a setting):
  weighted fair queuing by virtual finish tags. A request's tag is
  ``max(virtual time, its flow's last tag) + 1 / weight``; the smallest tag is
  sent first and the virtual time moves to it. A flow with a thousand waiting
  requests so gets one turn in each round of the flows waiting, whatever
  their number, and a flow that waited none starts level with the others (not
  with credit for the time it sent nothing);
- **bounded**: at most ``capacity`` wait. A full queue refuses a sheddable
  request at once; an urgent one takes the place of the newest sheddable one
  waiting, which is refused (the shed); if none is sheddable it is refused;
- **in time**: a request waits until its deadline at most; :meth:`FlowQueue.expired`
  hands back those past it.

Pure: no clock of its own (times are passed in), no I/O, no event loop. Every
admission is an :class:`Offer` that says what became of the request and of any
request it displaced.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_PRIORITY = 5
"""A request's priority when neither it nor its key names one."""
LOWEST_PRIORITY = 0
HIGHEST_PRIORITY = 9

Outcome = Literal["queued", "refused"]


class Waiting:
    """One request waiting in a :class:`FlowQueue` (its place is its :attr:`tag` within its priority)."""

    __slots__ = ("deadline", "flow", "live", "priority", "seq", "sheddable", "tag")

    def __init__(
        self, flow: str, priority: int, sheddable: bool, deadline: float, tag: float, seq: int
    ) -> None:
        self.flow = flow
        self.priority = priority
        self.sheddable = sheddable
        self.deadline = deadline
        self.tag = tag
        """The virtual finish tag: the smallest of a priority is sent first."""
        self.seq = seq
        """Arrival order: breaks ties between equal tags, oldest first."""
        self.live = True
        """Still waiting (False once sent on, refused, or taken out)."""

    def __lt__(self, other: Waiting) -> bool:
        return (self.tag, self.seq) < (other.tag, other.seq)


@dataclass(frozen=True, slots=True)
class Offer:
    """What became of a request offered to a full or open queue."""

    outcome: Outcome
    waiting: Waiting | None
    """Its place, when queued."""
    shed: Waiting | None = None
    """The sheddable request it displaced (refused now), if it took one's place."""
    reason: str = ""
    """Why it was refused, in words a client can act on."""


class FlowQueue:
    """One model's waiting requests: priority, then weighted fair between flows, bounded, in time."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a flow queue holds at least one request")
        self.capacity = capacity
        self._heaps: dict[int, list[Waiting]] = {}
        """Per priority, a heap of its waiting requests (taken-out ones stay until they surface)."""
        self._last_tag: dict[str, float] = {}
        """Each flow's latest finish tag (flows with nothing waiting are forgotten)."""
        self._waiting_by_flow: dict[str, int] = {}
        self._virtual = 0.0
        self._count = 0
        self._seq = itertools.count()

    def __len__(self) -> int:
        return self._count

    def by_flow(self) -> dict[str, int]:
        """Requests waiting, by flow."""
        return dict(self._waiting_by_flow)

    def offer(
        self,
        flow: str,
        *,
        priority: int = DEFAULT_PRIORITY,
        sheddable: bool = False,
        deadline: float,
        weight: float = 1.0,
    ) -> Offer:
        """Queue a request of ``flow``, or refuse it (or another) when the queue is full."""
        shed = None
        if self._count >= self.capacity:
            if sheddable:
                return Offer("refused", None, reason=self._full("sheddable requests are refused first"))
            shed = self._newest_sheddable()
            if shed is None:
                return Offer("refused", None, reason=self._full("none of them is sheddable"))
            self.remove(shed)
        start = max(self._virtual, self._last_tag.get(flow, 0.0))
        tag = start + 1.0 / max(weight, 1e-6)
        waiting = Waiting(flow, priority, sheddable, deadline, tag, next(self._seq))
        self._last_tag[flow] = tag
        self._waiting_by_flow[flow] = self._waiting_by_flow.get(flow, 0) + 1
        heapq.heappush(self._heaps.setdefault(priority, []), waiting)
        self._count += 1
        return Offer("queued", waiting, shed=shed)

    def peek(self) -> Waiting | None:
        """The request :meth:`next` would send on, left in the queue; None when none waits."""
        for priority in sorted(self._heaps, reverse=True):
            heap = self._heaps[priority]
            while heap and not heap[0].live:
                heapq.heappop(heap)
            if heap:
                return heap[0]
            del self._heaps[priority]
        return None

    def next(self) -> Waiting | None:
        """The request to send on now (taken out of the queue); None when none waits."""
        waiting = self.peek()
        if waiting is not None:
            heap = self._heaps[waiting.priority]
            heapq.heappop(heap)
            if not heap:
                del self._heaps[waiting.priority]
            self._virtual = max(self._virtual, waiting.tag)
            self._taken(waiting)
        return waiting

    def remove(self, waiting: Waiting) -> None:
        """Take ``waiting`` out (it gave up: its deadline, its client gone); again does nothing."""
        if waiting.live:
            self._taken(waiting)

    def expired(self, now: float) -> list[Waiting]:
        """Take out and return the requests whose deadline is past ``now``."""
        gone = [w for heap in self._heaps.values() for w in heap if w.live and w.deadline <= now]
        for waiting in gone:
            self._taken(waiting)
        return gone

    def _taken(self, waiting: Waiting) -> None:
        waiting.live = False
        self._count -= 1
        left = self._waiting_by_flow[waiting.flow] - 1
        if left:
            self._waiting_by_flow[waiting.flow] = left
        else:
            del self._waiting_by_flow[waiting.flow]
            if self._last_tag.get(waiting.flow, 0.0) <= self._virtual:
                del self._last_tag[waiting.flow]  # level with the others when it comes back
        if not self._count:
            self._heaps.clear()  # nothing live is left in them

    def _newest_sheddable(self) -> Waiting | None:
        candidates = [w for heap in self._heaps.values() for w in heap if w.live and w.sheddable]
        return max(candidates, key=lambda w: (-w.priority, w.seq)) if candidates else None

    def _full(self, why: str) -> str:
        return f"{self._count} requests already wait for this model, the most it queues, and {why}"


class FlowSettings(BaseModel):
    """How a busy model's requests wait in the gateway (``gateway.flow`` in server.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    mode: Literal["fifo", "fair"] = "fifo"
    """``fifo``: every request goes to the least-loaded replica at once and waits in the engine's
    own queue, first come first served. ``fair``: while no replica has a free slot, requests wait
    in the gateway, by priority and then fairly between flows, and are sent as slots free."""
    fair_by: Literal["project", "key"] = "project"
    """What a flow is: the key's project (or user), or the key itself."""
    queue_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    """Longest a request waits in the gateway for a slot; then 429 with ``Retry-After``."""
    queue_max: int = Field(default=1000, ge=1, le=1_000_000)
    """Requests one model queues at most; past it sheddable ones are refused first."""
    reserve_share: float = Field(default=0.0, ge=0, lt=1)
    """Part of a model's slots sheddable requests (priority 0) never take: headroom kept free for
    every other request, so an urgent one rarely waits for a slot behind a batch's (0: none kept)."""
