"""Placement: which node (and which cards) a new replica goes to, and why not elsewhere."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmgw.core.devices import NodeInventory


@dataclass(frozen=True)
class Placed:
    """A replica already on a node, with the memory it holds there."""

    model: str
    node_id: str
    memory_mb: int
    devices: tuple[int, ...] = ()


@dataclass(frozen=True)
class Decision:
    """Where a replica goes (``node_id`` empty when nowhere), and every refusal on the way."""

    node_id: str = ""
    devices: tuple[int, ...] = ()
    refusals: dict[str, str] = field(default_factory=dict)

    @property
    def placed(self) -> bool:
        return bool(self.node_id)


def free_memory(node: NodeInventory, placed: list[Placed]) -> int:
    """Host memory left on a node once the replicas placed there take theirs."""
    used = sum(p.memory_mb for p in placed if p.node_id == node.node_id and not p.devices)
    return node.memory_mb - used


def free_gpu_memory(node: NodeInventory, placed: list[Placed]) -> dict[int, int]:
    """Each card's memory left on a node once the replicas placed there take theirs."""
    free = {gpu.index: gpu.memory_free_mb for gpu in node.gpus}
    for p in placed:
        if p.node_id == node.node_id:
            for index in p.devices:
                if index in free:
                    free[index] -= p.memory_mb // max(1, len(p.devices))
    return free


def place(model: str, memory_mb: int, nodes: list[NodeInventory], placed: list[Placed]) -> Decision:
    """Pick the node for one more replica of ``model``.

    Among nodes, one with fewer replicas of the same model first, then one
    whose card has room over one with host memory alone, then the most memory
    left. On a node, a card with enough free memory is preferred to host memory.
    """
    refusals: dict[str, str] = {}
    candidates: list[tuple[tuple[int, bool, int], str, tuple[int, ...]]] = []
    for node in nodes:
        spread = sum(1 for p in placed if p.node_id == node.node_id and p.model == model)
        gpu_free = free_gpu_memory(node, placed)
        fitting = [index for index, free in gpu_free.items() if free >= memory_mb]
        if fitting:
            best = max(fitting, key=lambda index: gpu_free[index])
            candidates.append(((-spread, True, gpu_free[best]), node.node_id, (best,)))
            continue
        host_free = free_memory(node, placed)
        if host_free >= memory_mb:
            candidates.append(((-spread, False, host_free), node.node_id, ()))
            continue
        refusals[node.node_id] = (
            f"needs {memory_mb} MiB; {host_free} MiB of host memory left"
            + (f", at most {max(gpu_free.values())} MiB on a card" if gpu_free else "")
        )
    if not candidates:
        return Decision(refusals=refusals)
    candidates.sort(key=lambda c: c[0], reverse=True)
    _, node_id, devices = candidates[0]
    for _, other, _ in candidates[1:]:
        refusals[other] = "fits, but another node has fewer replicas of this model, a free card or more room"
    return Decision(node_id=node_id, devices=devices, refusals=refusals)
