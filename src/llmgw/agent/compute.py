"""Where a shard really computes: the engine's own output, and nvidia-smi's processes.

llama.cpp at its default verbosity says neither the devices it uses nor the
layers it offloads, so the cards the shard's processes hold memory on (and
how much) are read from the cards' report too, and taken where the output
says nothing. A shard given GPUs whose engine says it found no usable GPU or
offloaded no layer is refused: it would serve, slowly, on the CPU.
"""

from __future__ import annotations

from collections.abc import Collection

from llmgw.agent.gpus import GpuReport, processes_by_device
from llmgw.core.shards import Compute
from llmgw.engines import engine as engines

NO_USABLE_GPU = "no usable GPU found"


def device_index(name: str) -> int:
    """``CUDA0`` → 0, ``Vulkan1`` → 1 (-1 when the name carries no number)."""
    digits = "".join(ch for ch in name if ch.isdigit())
    return int(digits) if digits else -1


def memory_held(report: GpuReport | None, pids: Collection[int]) -> dict[int, int] | None:
    """MiB the given processes hold on each device (card or MIG number); None without a report."""
    if report is None:
        return None
    held: dict[int, int] = {}
    for device, processes in processes_by_device(report).items():
        used = sum(process.used_mb for process in processes if process.pid in pids)
        if any(process.pid in pids for process in processes):
            held[device] = used
    return held


def compute_of(parsed: engines.Compute, held: dict[int, int] | None) -> Compute:
    """The shard's compute: the engine's word on devices and layers, nvidia-smi's on memory."""
    if parsed.devices and parsed.backend != "cpu":
        devices = [device_index(name) for name in parsed.devices]
        memory = sum(held.get(d, 0) for d in devices) if held else 0
        return Compute(
            backend=parsed.backend,
            devices=tuple(devices),
            layers_offloaded=parsed.layers_offloaded or 0,
            memory_mb=memory,
        )
    if held:
        return Compute(
            backend="cuda",
            devices=tuple(sorted(held)),
            layers_offloaded=parsed.layers_offloaded or 0,
            memory_mb=sum(held.values()),
        )
    return Compute(backend="cpu", layers_offloaded=parsed.layers_offloaded or 0)


def refusal(output: str, parsed: engines.Compute, given: Collection[int]) -> str:
    """Why a shard given GPUs must not serve as it computes (empty when it may)."""
    if not given:
        return ""
    where = "GPU " + ",".join(str(d) for d in given)
    if NO_USABLE_GPU in output:
        return (
            f"the engine was given {where} but found no usable GPU and computes on the CPU: "
            "check the driver ('nvidia-smi'), that the node's engine build is a GPU build "
            "('llmgw ctl engine-check'), and CUDA_VISIBLE_DEVICES"
        )
    if parsed.layers_offloaded == 0:
        return (
            f"the engine was given {where} but offloaded no layer and computes on the CPU: "
            "remove a -ngl/--n-gpu-layers 0 from the profile's args, and check the build with "
            "'llmgw ctl engine-check'"
        )
    return ""
