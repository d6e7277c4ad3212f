"""Discovery: what a node offers — CPU cores, host memory, NVIDIA cards, driver.

The parsing functions are pure (text in, values out); :func:`discover` does the
reading: ``/proc`` and the cgroup files for the CPU and memory, a
:class:`~llmgw.agent.gpus.GpuSource` (NVML or ``nvidia-smi -q -x``) for the
cards and ``/proc/driver/nvidia/version`` for the driver. A node without
either has no cards; a reader that fails or hangs is logged and the node is
reported without cards rather than not at all.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import platform
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from llmgw.agent.gpus import GpuSource, devices_of
from llmgw.agent.nvidia_smi import NVIDIA_SMI_TIMEOUT, NvidiaSmi, leading_int, parse_report, run_nvidia_smi
from llmgw.agent.nvml import open_nvml
from llmgw.core.devices import Device, NodeInventory

__all__ = ["NVIDIA_SMI_TIMEOUT", "choose_source", "discover", "discover_gpus", "run_nvidia_smi"]

log = logging.getLogger(__name__)

_NO_LIMIT_BYTES = 1 << 60
"""cgroup v1 writes an unset memory limit as a huge number near 2**63."""


# ---------------------------------------------------------------- pure parsing


def parse_driver_version(text: str) -> str | None:
    """The driver version from ``/proc/driver/nvidia/version``, or None.

    Both the proprietary module's line (``NVRM version: NVIDIA UNIX x86_64
    Kernel Module  550.54.14  Thu Feb 22 ...``) and the open module's
    (``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.82.07
    Release Build ...``) give the first dotted number after ``NVRM version:``.
    """
    for line in text.splitlines():
        if not line.startswith("NVRM version:"):
            continue
        found = re.search(r"(?<![\w.])(\d+\.\d+(?:\.\d+)*)(?![\w.])", line)
        if found:
            return found.group(1)
    return None


def parse_nvidia_smi_xml(text: str, listing: str = "") -> list[Device]:
    """The devices in ``nvidia-smi -q -x`` output (with ``-L`` for MIG names), as placement sees them.

    A card is one device; a card in MIG mode is its instances, numbered
    ``1000 + 100 x card + instance``. Raises ``xml.etree.ElementTree.ParseError``
    on text that is not XML.
    """
    return devices_of(parse_report(text, listing))


def nvidia_smi_driver_version(text: str) -> str | None:
    """``<driver_version>`` from ``nvidia-smi -q -x`` output, or None."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        return None
    value = (root.findtext("driver_version") or "").strip()
    return value if value and value != "N/A" else None


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` as a mapping of field to KiB (``MemTotal``, ``MemAvailable``...)."""
    fields: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        number = value.split()
        if number and number[0].isdigit():
            fields[key.strip()] = int(number[0])
    return fields


def parse_cpu_model(text: str) -> str:
    """The processor's name from ``/proc/cpuinfo`` (x86 ``model name``, Arm ``Model``...)."""
    for key in ("model name", "Model", "Hardware", "cpu model", "cpu"):
        for line in text.splitlines():
            field, _, value = line.partition(":")
            if field.strip() == key and value.strip():
                return value.strip()
    return ""


def parse_cpu_max(text: str) -> float | None:
    """CPUs a cgroup v2 ``cpu.max`` (``"200000 100000"``) allows, or None for ``max``."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    try:
        quota = int(parts[0])
        period = int(parts[1]) if len(parts) > 1 else 100_000
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def parse_memory_max(text: str) -> int | None:
    """Bytes a cgroup's ``memory.max`` / ``memory.limit_in_bytes`` allows, or None if unlimited."""
    value = text.strip()
    if not value.isdigit():
        return None
    limit = int(value)
    return None if limit >= _NO_LIMIT_BYTES else limit


_leading_int = leading_int


# ---------------------------------------------------------------- reading the host


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _own_cgroup_dirs(proc_root: Path, cgroup_root: Path) -> list[Path]:
    """This process's cgroup v2 directory and the hierarchy's root, most specific first."""
    dirs = []
    text = _read(proc_root / "self" / "cgroup") or ""
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "" and path.strip("/"):
            dirs.append(cgroup_root / path.strip("/"))
    dirs.append(cgroup_root)
    return dirs


def cpu_cores(proc_root: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """Cores this process may use: its affinity, lowered by a cgroup CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quotas = []
    for directory in _own_cgroup_dirs(proc_root, cgroup_root):
        quota = parse_cpu_max(_read(directory / "cpu.max") or "")
        if quota is not None:
            quotas.append(quota)
    v1_quota = _read(cgroup_root / "cpu" / "cpu.cfs_quota_us")
    v1_period = _read(cgroup_root / "cpu" / "cpu.cfs_period_us")
    if v1_quota and v1_period:
        quota = parse_cpu_max(f"{v1_quota.strip()} {v1_period.strip()}")
        if quota is not None:
            quotas.append(quota)
    if quotas:
        cores = min(cores, max(1, math.ceil(min(quotas))))
    return max(cores, 1)


def host_memory(
    proc_root: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")
) -> tuple[int, int]:
    """(total, available) host memory in MiB, lowered to a cgroup memory limit."""
    meminfo = parse_meminfo(_read(proc_root / "meminfo") or "")
    total = meminfo.get("MemTotal", 0) * 1024
    available = meminfo.get("MemAvailable", meminfo.get("MemFree", 0)) * 1024
    limits = [
        (directory / "memory.max", directory / "memory.current")
        for directory in _own_cgroup_dirs(proc_root, cgroup_root)
    ]
    limits.append(
        (cgroup_root / "memory" / "memory.limit_in_bytes", cgroup_root / "memory" / "memory.usage_in_bytes")
    )
    for limit_file, usage_file in limits:
        limit = parse_memory_max(_read(limit_file) or "")
        if limit is not None and (total == 0 or limit < total):
            used = _leading_int(_read(usage_file)) or 0
            room = max(limit - used, 0)
            total, available = limit, min(available, room) if available else room
    return total // (1 << 20), available // (1 << 20)


def cpu_device(proc_root: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> Device:
    """The CPU as a device: its model name and the host memory engines may use."""
    total, available = host_memory(proc_root, cgroup_root)
    name = parse_cpu_model(_read(proc_root / "cpuinfo") or "") or platform.processor() or platform.machine()
    return Device(
        kind="cpu",
        index=0,
        name=name or "cpu",
        memory_mb=total,
        memory_free_mb=available,
        device_class="cpu",
    )


def choose_source(nvidia_smi: str = "nvidia-smi", timeout: float = NVIDIA_SMI_TIMEOUT) -> GpuSource:
    """NVML when it starts, else ``nvidia-smi``; a named nvidia-smi binary is always used as given."""
    if nvidia_smi == "nvidia-smi":
        nvml = open_nvml()
        if nvml is not None:
            return nvml
    return NvidiaSmi(nvidia_smi, timeout)


async def discover_gpus(
    nvidia_smi: str = "nvidia-smi", *, timeout: float = NVIDIA_SMI_TIMEOUT, source: GpuSource | None = None
) -> tuple[list[Device], str | None]:
    """The NVIDIA devices and the reader's driver version, or ``([], None)`` without them."""
    report = await (source or NvidiaSmi(nvidia_smi, timeout)).read()
    if report is None:
        return [], None
    return devices_of(report), report.driver_version or None


async def discover(
    node_id: str,
    address: str,
    *,
    nvidia_smi: str = "nvidia-smi",
    proc_version: Path = Path("/proc/driver/nvidia/version"),
    proc_root: Path = Path("/proc"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    timeout: float = NVIDIA_SMI_TIMEOUT,
    gpus_from: GpuSource | None = None,
) -> NodeInventory:
    """What this node offers, as its agent registers it.

    ``gpus_from`` reads the cards (see :func:`choose_source`); without it
    ``nvidia_smi``, a command name looked up on PATH or a path to the binary,
    does. ``proc_root`` and ``cgroup_root`` are where ``/proc`` and the cgroup
    hierarchy are read from.
    """
    cpu = await asyncio.to_thread(cpu_device, proc_root, cgroup_root)
    cores = await asyncio.to_thread(cpu_cores, proc_root, cgroup_root)
    gpus, smi_driver = await discover_gpus(nvidia_smi, timeout=timeout, source=gpus_from)
    proc_text = await asyncio.to_thread(_read, proc_version)
    driver = (parse_driver_version(proc_text) if proc_text else None) or smi_driver or ""
    return NodeInventory(
        node_id=node_id,
        address=address,
        cpu_cores=cores,
        memory_mb=cpu.memory_mb,
        devices=(cpu, *gpus),
        driver_version=driver,
    )
