"""Training placement: which node and card a queued job goes to, and why not every other.

A job on a card needs one whose free memory (as the node's telemetry last
read it) is at least the job's ``memory_mb``, with no process of anyone else
on it and no replica holding it. A job on the CPU needs a node whose host
memory, less what its host-memory replicas hold, leaves that much. A node
trains one job at a time. Among the nodes that fit, the one with the most
room wins; the decision names every node and card turned down, and why.

The other way round, :func:`withheld` keeps replica placement off what a
training job holds: the card it trains on (marked unavailable, naming the
job) and, for a job on the CPU, its ``memory_mb`` of host memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from llmgw.core.devices import NodeInventory
from llmgw.core.mig import device_label
from llmgw.core.placement import Placed, free_memory
from llmgw.core.training import ANY_NODE, CPU, JobState


@dataclass(frozen=True)
class TrainingAsk:
    """What a job needs: ``memory_mb`` on a card (or on the CPU), on ``node`` or any node."""

    job_id: str
    memory_mb: int
    device_kind: str = "card"
    """``card`` or ``cpu``."""
    node: str = ANY_NODE


@dataclass(frozen=True)
class TrainingNode:
    """A connected node as training placement sees it."""

    inventory: NodeInventory
    foreign: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    """Each card's processes that are not llmgw's (names), from the node's telemetry."""
    training: str = ""
    """The job it trains now (empty: none)."""


@dataclass(frozen=True)
class TrainingDecision:
    """Where a job goes (``node_id`` empty: nowhere yet), and why every other place was turned down."""

    node_id: str = ""
    device: str = ""
    """``cpu`` or a card's label (``0``, ``1/mig0``)."""
    refusals: dict[str, str] = field(default_factory=dict)

    @property
    def placed(self) -> bool:
        return bool(self.node_id)

    @property
    def reasons(self) -> str:
        """The refusals on one line, by node (what ``ctl train status`` shows for a queued job)."""
        if not self.refusals:
            return "no node is connected"
        return "; ".join(f"{node}: {why}" for node, why in sorted(self.refusals.items()))


def place_training(
    ask: TrainingAsk, nodes: Sequence[TrainingNode], placed: Sequence[Placed]
) -> TrainingDecision:
    """Pick the node and device for ``ask``: see the module's rules."""
    refusals: dict[str, str] = {}
    fitting: list[tuple[int, str, str]] = []
    for node in nodes:
        inventory = node.inventory
        node_id = inventory.node_id
        if ask.node != ANY_NODE and node_id != ask.node:
            refusals[node_id] = f"the job asks for node {ask.node}"
            continue
        if node.training:
            refusals[node_id] = f"trains job {node.training}; a node trains one job at a time"
            continue
        here = [p for p in placed if p.node_id == node_id]
        if ask.device_kind == CPU:
            left = free_memory(inventory, here)
            if left >= ask.memory_mb:
                fitting.append((left, node_id, CPU))
            else:
                refusals[node_id] = f"needs {ask.memory_mb} MiB of host memory; {left} MiB left"
            continue
        room, why = _cards(ask.memory_mb, node, here)
        if room:
            free, label = max(room)
            fitting.append((free, node_id, label))
        else:
            refusals[node_id] = "; ".join(why) if why else "has no card"
    if ask.node != ANY_NODE and ask.node not in {n.inventory.node_id for n in nodes}:
        refusals[ask.node] = "not connected"
    if not fitting:
        return TrainingDecision(refusals=refusals)
    fitting.sort(reverse=True)
    _, node_id, device = fitting[0]
    for _, other, _ in fitting[1:]:
        refusals[other] = "fits, but another node has more room"
    return TrainingDecision(node_id=node_id, device=device, refusals=refusals)


def _cards(
    memory_mb: int, node: TrainingNode, here: Sequence[Placed]
) -> tuple[list[tuple[int, str]], list[str]]:
    """The node's cards that fit (free MiB, label), and why each other one does not."""
    held = {index: p.model for p in here for index in p.devices}
    room: list[tuple[int, str]] = []
    why: list[str] = []
    for gpu in node.inventory.gpus:
        label = f"card {device_label(gpu.index)}"
        if gpu.unavailable:
            why.append(f"{label}: {gpu.unavailable}")
        elif gpu.index in held:
            why.append(f"{label}: a replica of {held[gpu.index]} holds it")
        elif node.foreign.get(gpu.index):
            names = ", ".join(node.foreign[gpu.index])
            why.append(f"{label}: a process that is not llmgw's runs on it ({names})")
        elif gpu.memory_free_mb < memory_mb:
            why.append(f"{label}: {gpu.memory_free_mb} MiB free, the job needs {memory_mb}")
        else:
            room.append((gpu.memory_free_mb, device_label(gpu.index)))
    return room, why


HOLDING = frozenset({JobState.PLACED, JobState.PREPARING, JobState.TRAINING, JobState.CONVERTING})
"""The states in which a job holds its card (or host memory): sent to its node and not finished there
(a job collecting its results has stopped training)."""


@dataclass(frozen=True)
class TrainingHold:
    """What a job placed on a node holds: a card (its label), or ``cpu`` and ``memory_mb`` of host memory."""

    job_id: str
    node_id: str
    device: str
    memory_mb: int


def withheld(nodes: Sequence[NodeInventory], holds: Sequence[TrainingHold]) -> list[NodeInventory]:
    """``nodes`` as replica placement sees them while ``holds`` train: each card a job trains on is
    unavailable (``training job J trains on it``), and a CPU job's memory is taken from host memory."""
    if not holds:
        return list(nodes)
    by_node: dict[str, list[TrainingHold]] = {}
    for hold in holds:
        by_node.setdefault(hold.node_id, []).append(hold)
    seen = []
    for node in nodes:
        here = by_node.get(node.node_id)
        if not here:
            seen.append(node)
            continue
        cards = {hold.device: hold.job_id for hold in here if hold.device != CPU}
        host = sum(hold.memory_mb for hold in here if hold.device == CPU)
        devices = tuple(
            replace(d, unavailable=f"training job {cards[device_label(d.index)]} trains on it")
            if d.kind == "nvidia" and device_label(d.index) in cards
            else d
            for d in node.devices
        )
        seen.append(replace(node, devices=devices, memory_mb=node.memory_mb - host))
    return seen
