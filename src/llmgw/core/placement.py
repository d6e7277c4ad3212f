"""Placement: which node (and which cards) a new replica goes to, and why not elsewhere."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmgw.core.devices import NodeInventory
from llmgw.core.mig import Spread, device_label, mig_refusal


@dataclass(frozen=True)
class Placed:
    """A replica already on a node, with the memory it holds there."""

    model: str
    node_id: str
    memory_mb: int
    devices: tuple[int, ...] = ()
    replica_id: str = ""
    priority: int = 0
    """The priority of the replica's model: only a model above it may evict it."""
    draining: bool = False
    """Being drained (scaled down or evicted): it still holds its memory until it stops."""
    environment: str = ""
    """The environment the replica serves (models sharing one engine); empty: none."""


@dataclass(frozen=True)
class Ask:
    """One profile of the replica asked for, as placement needs it."""

    memory_mb: int
    spread: Spread = field(default_factory=Spread)
    gpu_class: str | None = None


@dataclass(frozen=True)
class ShardPlace:
    """Where one more shard of a multi-node replica goes: a node and its cards."""

    node_id: str
    devices: tuple[int, ...] = ()


@dataclass(frozen=True)
class Decision:
    """Where a replica goes (``node_id`` empty when nowhere), and every refusal on the way.

    ``profile``: the index of the profile it runs (the first that fits). When it
    fits nowhere but would on ``evict_node`` once lower-priority replicas go,
    ``evict`` names the replicas to drain (empty while the ones named in
    ``waiting_for`` drain) and ``kept`` says why each other replica looked at is not evicted.
    """

    node_id: str = ""
    devices: tuple[int, ...] = ()
    refusals: dict[str, str] = field(default_factory=dict)
    profile: int = 0
    evict_node: str = ""
    evict: tuple[str, ...] = ()
    waiting_for: tuple[str, ...] = ()
    kept: dict[str, str] = field(default_factory=dict)
    more: tuple[ShardPlace, ...] = ()

    @property
    def placed(self) -> bool:
        return bool(self.node_id)


def free_memory(node: NodeInventory, placed: list[Placed]) -> int:
    """Host memory left on a node once the replicas placed there take theirs."""
    used = sum(p.memory_mb for p in placed if p.node_id == node.node_id and not p.devices)
    return node.memory_mb - used


def free_gpu_memory(node: NodeInventory, placed: list[Placed]) -> dict[int, int]:
    """Each usable card's (or MIG instance's) memory left once the replicas placed there take theirs."""
    free = {gpu.index: gpu.memory_free_mb for gpu in node.gpus if not gpu.unavailable}
    for p in placed:
        if p.node_id == node.node_id:
            for index in p.devices:
                if index in free:
                    free[index] -= p.memory_mb // max(1, len(p.devices))
    return free


def place(
    model: str,
    memory_mb: int,
    nodes: list[NodeInventory],
    placed: list[Placed],
    spread_over: Spread | None = None,
    *,
    gpu_class: str | None = None,
) -> Decision:
    """Pick the node for one more replica of ``model``.

    Among nodes, one with fewer replicas of the same model first, then one
    whose card has room over one with host memory alone, then the most memory
    left. On a node, a card with enough free memory is preferred to host memory.
    A replica spanning several cards (``spread_over.gpus``, at least its tensor-parallel
    ``tp``) needs that many cards on one node, each with its share of the memory; with
    ``gpu_class`` only cards of that class count. Either one rules out host
    memory. Cards marked unavailable (a MIG card with nothing carved) are never
    picked, nor MIG instances for a replica spread over more than one device.
    """
    spread_over = spread_over or Spread()
    gpus = max(1, spread_over.tp, spread_over.gpus)
    refusals: dict[str, str] = {}
    candidates: list[tuple[tuple[int, bool, int], str, tuple[int, ...]]] = []
    share = -(-memory_mb // gpus)
    needs_cards = gpus > 1 or bool(gpu_class) or spread_over.nodes > 1
    on_node: dict[str, list[Placed]] = {}
    for p in placed:  # each node's replicas, once: a pass over every node stays linear at a thousand
        on_node.setdefault(p.node_id, []).append(p)
    for node in nodes:
        here = on_node.get(node.node_id, [])
        spread = sum(1 for p in here if p.model == model)
        gpu_free = free_gpu_memory(node, here)
        cards = node.gpus
        left_out = [f"card {device_label(g.index)}: {g.unavailable}" for g in cards if g.unavailable]
        for gpu in cards:
            reason = mig_refusal(gpu.device_class, spread_over)
            if reason and gpu.index in gpu_free:
                del gpu_free[gpu.index]
                left_out.append(f"device {device_label(gpu.index)}: {reason}")
        classes = {gpu.index: gpu.device_class for gpu in cards} if gpu_class else {}
        fitting = [
            index
            for index, free in gpu_free.items()
            if free >= share and (not gpu_class or classes.get(index) == gpu_class)
        ]
        if len(fitting) >= gpus:
            chosen = sorted(fitting, key=lambda index: gpu_free[index], reverse=True)[:gpus]
            least = min(gpu_free[index] for index in chosen)
            candidates.append(((-spread, True, least), node.node_id, tuple(sorted(chosen))))
            continue
        if needs_cards:
            kind = ("card" if gpus == 1 else "cards") + (f" of class {gpu_class}" if gpu_class else "")
            refusals[node.node_id] = (
                f"needs {gpus} {kind} with {share} MiB free each; {len(fitting)} there"
                + "".join(f"; {reason}" for reason in left_out)
            )
            continue
        host_free = free_memory(node, here)
        if host_free >= memory_mb:
            candidates.append(((-spread, False, host_free), node.node_id, ()))
            continue
        refusals[node.node_id] = (
            f"needs {memory_mb} MiB; {host_free} MiB of host memory left"
            + (f", at most {max(gpu_free.values())} MiB on a card" if gpu_free else "")
            + "".join(f"; {reason}" for reason in left_out)
        )
    if not candidates:
        return Decision(refusals=refusals)
    candidates.sort(key=lambda c: c[0], reverse=True)
    _, node_id, devices = candidates[0]
    for _, other, _ in candidates[1:]:
        refusals[other] = "fits, but another node has fewer replicas of this model, a free card or more room"
    return Decision(node_id=node_id, devices=devices, refusals=refusals)


def place_nodes(
    model: str,
    memory_mb: int,
    nodes: list[NodeInventory],
    placed: list[Placed],
    spread: Spread,
    *,
    gpu_class: str | None = None,
) -> Decision:
    """Pick ``spread.nodes`` distinct nodes for one multi-node replica of ``model`` (C5.5).

    Each node takes one shard: ``spread.gpus`` cards holding ``memory_mb / nodes``
    between them (host memory never serves a multi-node replica, nor a MIG instance).
    A node set is turned down exactly when one of its nodes is, so each node's
    reason covers every set it is in: a node without the room says what it lacks,
    one with the room says how many of the nodes needed fit, or, when enough do,
    which nodes were taken before it. The nodes taken are the ones with fewer
    replicas of the model, then the most memory left on their cards; the first is
    the head (rank 0), which serves the replica's requests.
    """
    share = -(-memory_mb // max(1, spread.nodes))
    per_node = Spread(tp=1, pp=1, gpus=max(1, spread.gpus), nodes=spread.nodes)
    refusals: dict[str, str] = {}
    fitting: list[tuple[tuple[int, int], ShardPlace]] = []
    for node in nodes:
        found = place(model, share, [node], placed, per_node, gpu_class=gpu_class)
        if not found.placed:
            refusals[node.node_id] = found.refusals.get(node.node_id, "does not fit")
            continue
        siblings = sum(1 for p in placed if p.node_id == node.node_id and p.model == model)
        free = free_gpu_memory(node, placed)
        least = min(free[index] for index in found.devices)
        fitting.append(((siblings, -least), ShardPlace(node.node_id, found.devices)))
    cards = "card" if per_node.gpus == 1 else "cards"
    fits = f"fits one shard ({share} MiB on {per_node.gpus} {cards})"
    if len(fitting) < spread.nodes:
        for _, shard in fitting:
            refusals[shard.node_id] = (
                f"{fits}, but a replica spans {spread.nodes} nodes and only {len(fitting)} "
                f"{'has' if len(fitting) == 1 else 'have'} the room"
            )
        return Decision(refusals=refusals)
    fitting.sort(key=lambda f: f[0])
    chosen = [shard for _, shard in fitting[: spread.nodes]]
    taken = ", ".join(s.node_id for s in chosen)
    for _, shard in fitting[spread.nodes :]:
        refusals[shard.node_id] = f"{fits}, but {taken} were taken: fewer replicas of this model, more room"
    head, *more = chosen
    return Decision(node_id=head.node_id, devices=head.devices, refusals=refusals, more=tuple(more))


def place_profiles(model: str, asks: list[Ask], nodes: list[NodeInventory], placed: list[Placed]) -> Decision:
    """Pick the node for one more replica of ``model``, trying its profiles in order.

    The first profile is tried on every node, then the second, and so on; the
    decision says which profile the replica runs. With several profiles each
    node's reason names every profile's refusal (``profile 1: …; profile 2: …``).
    """
    seen: dict[str, list[str]] = {}
    for index, ask in enumerate(asks):
        if ask.spread.nodes > 1:
            found = place_nodes(model, ask.memory_mb, nodes, placed, ask.spread, gpu_class=ask.gpu_class)
        else:
            found = place(model, ask.memory_mb, nodes, placed, ask.spread, gpu_class=ask.gpu_class)
        if found.placed:
            refusals = {node: "; ".join(reasons) for node, reasons in seen.items() if node != found.node_id}
            for node, why in found.refusals.items():
                refusals[node] = "; ".join([*seen.get(node, []), _named(index, asks, why)])
            return Decision(
                node_id=found.node_id,
                devices=found.devices,
                refusals=refusals,
                profile=index,
                more=found.more,
            )
        for node, why in found.refusals.items():
            seen.setdefault(node, []).append(_named(index, asks, why))
    return Decision(refusals={node: "; ".join(reasons) for node, reasons in seen.items()})


def _named(index: int, asks: list[Ask], why: str) -> str:
    return f"profile {index + 1}: {why}" if len(asks) > 1 else why
