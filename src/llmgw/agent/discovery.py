"""Discovery: what a node offers — CPU cores, host memory, NVIDIA cards, driver.

The parsing functions are pure (text in, values out); :func:`discover` does the
reading: ``/proc`` and the cgroup files for the CPU and memory, ``nvidia-smi -q
-x`` for the cards and ``/proc/driver/nvidia/version`` for the driver. A node
without ``nvidia-smi`` has no cards; an ``nvidia-smi`` that fails or hangs is
logged and the node is reported without cards rather than not at all.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import platform
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

from llmgw.core.devices import Device, NodeInventory, gpu_class

log = logging.getLogger(__name__)

NVIDIA_SMI_TIMEOUT = 15.0
"""Seconds ``nvidia-smi -q -x`` may take; a wedged driver can hang it for minutes."""

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


def parse_nvidia_smi_xml(text: str) -> list[Device]:
    """The cards in ``nvidia-smi -q -x`` output, in the order nvidia-smi numbers them.

    Each card's ``index`` is its position in the report, which is nvidia-smi's
    and NVML's index (PCI bus order) — not ``minor_number``, the ``/dev/nvidiaN``
    number, which can differ. Memory comes from ``fb_memory_usage`` in MiB; a
    reading of ``N/A`` counts as 0. Raises ``xml.etree.ElementTree.ParseError``
    on text that is not XML.
    """
    root = ET.fromstring(text)
    devices = []
    for position, gpu in enumerate(root.findall("gpu")):
        explicit_index = _leading_int(gpu.findtext("index"))
        index = explicit_index if explicit_index is not None else position
        name = (gpu.findtext("product_name") or "").strip() or "NVIDIA GPU"
        total = _leading_int(gpu.findtext("fb_memory_usage/total")) or 0
        free = _leading_int(gpu.findtext("fb_memory_usage/free"))
        if free is None:
            used = _leading_int(gpu.findtext("fb_memory_usage/used")) or 0
            free = max(total - used, 0)
        devices.append(
            Device(
                kind="nvidia",
                index=index,
                name=name,
                memory_mb=total,
                memory_free_mb=free,
                uuid=(gpu.findtext("uuid") or "").strip(),
                device_class=gpu_class(name, total),
            )
        )
    return devices


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


def _leading_int(text: str | None) -> int | None:
    """``"81920 MiB"`` → 81920; ``"N/A"``, empty or missing → None."""
    if text is None:
        return None
    found = re.match(r"\s*(\d+)", text)
    return int(found.group(1)) if found else None


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


async def run_nvidia_smi(nvidia_smi: str, *args: str, timeout: float = NVIDIA_SMI_TIMEOUT) -> str | None:
    """stdout of ``nvidia-smi ARGS``, or None when it is missing, fails or hangs.

    A missing binary is a node without NVIDIA cards and is not logged above
    debug; a failure or a timeout is logged as a warning with what the tool
    said (it prints its errors on stdout as often as on stderr).
    """
    binary = shutil.which(nvidia_smi)
    if binary is None:
        log.debug("no %s on PATH: this node has no NVIDIA cards", nvidia_smi)
        return None
    command = " ".join((binary, *args))
    try:
        process = await asyncio.create_subprocess_exec(
            binary,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as error:
        log.warning(
            "cannot run %s: %s; reporting no NVIDIA cards (check the file is an executable nvidia-smi)",
            command,
            error,
        )
        return None
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        log.warning(
            "%s did not answer within %.0f s; reporting no NVIDIA cards "
            "(a hung nvidia-smi usually means a wedged driver: check dmesg for Xid errors)",
            command,
            timeout,
        )
        return None
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    if process.returncode != 0:
        said = (stderr.decode(errors="replace").strip() or stdout.decode(errors="replace").strip())[:2000]
        log.warning(
            "%s failed with exit status %s: %s; reporting no NVIDIA cards "
            "(run nvidia-smi by hand and check the driver is loaded)",
            command,
            process.returncode,
            said or "(no output)",
        )
        return None
    return stdout.decode(errors="replace")


async def discover_gpus(
    nvidia_smi: str = "nvidia-smi", *, timeout: float = NVIDIA_SMI_TIMEOUT
) -> tuple[list[Device], str | None]:
    """The NVIDIA cards and nvidia-smi's driver version, or ``([], None)`` without them."""
    text = await run_nvidia_smi(nvidia_smi, "-q", "-x", timeout=timeout)
    if text is None:
        return [], None
    try:
        devices = parse_nvidia_smi_xml(text)
    except ET.ParseError as error:
        log.warning(
            "%s -q -x printed something that is not XML (%s); reporting no NVIDIA cards "
            "(check the nvidia-smi on PATH is NVIDIA's)",
            nvidia_smi,
            error,
        )
        return [], None
    return devices, nvidia_smi_driver_version(text)


async def discover(
    node_id: str,
    address: str,
    *,
    nvidia_smi: str = "nvidia-smi",
    proc_version: Path = Path("/proc/driver/nvidia/version"),
    proc_root: Path = Path("/proc"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    timeout: float = NVIDIA_SMI_TIMEOUT,
) -> NodeInventory:
    """What this node offers, as its agent registers it.

    ``nvidia_smi`` is a command name looked up on PATH or a path to the binary;
    ``proc_root`` and ``cgroup_root`` are where ``/proc`` and the cgroup
    hierarchy are read from.
    """
    cpu = await asyncio.to_thread(cpu_device, proc_root, cgroup_root)
    cores = await asyncio.to_thread(cpu_cores, proc_root, cgroup_root)
    gpus, smi_driver = await discover_gpus(nvidia_smi, timeout=timeout)
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
