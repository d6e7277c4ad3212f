"""Reading the cards through ``nvidia-smi``: the XML report, the listing, NVLink counters.

``nvidia-smi -q -x`` gives each card's memory, MIG mode, MIG devices (their
GPU and compute instance ids, multiprocessors, memory) and processes (with the
instance they run in); ``nvidia-smi -L`` gives each MIG device's profile and
UUID, which the XML leaves out on many drivers; ``nvidia-smi nvlink -e`` gives
the NVLink error counters. The parsing functions are pure.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import xml.etree.ElementTree as ET
from dataclasses import replace

from llmgw.agent.gpus import Card, GpuProcess, GpuReport, MigInstance
from llmgw.core.mig import normalise_profile

log = logging.getLogger(__name__)

NVIDIA_SMI_TIMEOUT = 15.0
"""Seconds ``nvidia-smi -q -x`` may take; a wedged driver can hang it for minutes."""


def leading_int(text: str | None) -> int | None:
    """``"81920 MiB"`` → 81920; ``"N/A"``, empty or missing → None."""
    if text is None:
        return None
    found = re.match(r"\s*(\d+)", text)
    return int(found.group(1)) if found else None


def _leading_float(text: str | None) -> float | None:
    found = re.match(r"\s*(\d+(?:\.\d+)?)", text or "")
    return float(found.group(1)) if found else None


def _memory(element: ET.Element | None) -> tuple[int, int]:
    """(total, free) MiB of an ``fb_memory_usage`` element; free from used when N/A."""
    if element is None:
        return 0, 0
    total = leading_int(element.findtext("total")) or 0
    free = leading_int(element.findtext("free"))
    if free is None:
        used = leading_int(element.findtext("used"))
        free = max(total - used, 0) if used is not None else total
    return total, free


def _processes(gpu: ET.Element) -> tuple[GpuProcess, ...]:
    found = []
    for info in gpu.findall("processes/process_info"):
        pid = leading_int(info.findtext("pid"))
        if pid is None:
            continue
        found.append(
            GpuProcess(
                pid=pid,
                name=(info.findtext("process_name") or "").strip(),
                used_mb=leading_int(info.findtext("used_memory")) or 0,
                gpu_instance_id=leading_int(info.findtext("gpu_instance_id")),
                compute_instance_id=leading_int(info.findtext("compute_instance_id")),
            )
        )
    return tuple(found)


_MULTIPROCESSORS = "device_attributes/shared/multiprocessor_count"


def _instances(gpu: ET.Element, processes: tuple[GpuProcess, ...]) -> tuple[MigInstance, ...]:
    instances = []
    for position, mig in enumerate(gpu.findall("mig_devices/mig_device")):
        index = leading_int(mig.findtext("index"))
        gi = leading_int(mig.findtext("gpu_instance_id")) or 0
        ci = leading_int(mig.findtext("compute_instance_id")) or 0
        total, free = _memory(mig.find("fb_memory_usage"))
        instances.append(
            MigInstance(
                index=position if index is None else index,
                uuid=(mig.findtext("uuid") or "").strip(),
                profile=normalise_profile(mig.findtext("profile_name") or ""),
                gpu_instance_id=gi,
                compute_instance_id=ci,
                memory_mb=total,
                memory_free_mb=free,
                multiprocessors=leading_int(mig.findtext("device_attributes/shared/multiprocessor_count"))
                or 0,
                processes=tuple(
                    p for p in processes if p.gpu_instance_id == gi and p.compute_instance_id in (ci, None)
                ),
            )
        )
    return tuple(instances)


def parse_report(text: str, listing: str = "") -> GpuReport:
    """The cards in ``nvidia-smi -q -x`` output, MIG profiles and UUIDs filled from ``-L``.

    Each card's index is its ``<index>`` or its position in the report (PCI bus
    order, as NVML numbers them), never ``minor_number``. Raises
    ``xml.etree.ElementTree.ParseError`` on text that is not XML.
    """
    root = ET.fromstring(text)
    names = parse_listing(listing)
    cards = []
    for position, gpu in enumerate(root.findall("gpu")):
        explicit = leading_int(gpu.findtext("index"))
        index = position if explicit is None else explicit
        total, free = _memory(gpu.find("fb_memory_usage"))
        processes = _processes(gpu)
        instances = tuple(
            replace(
                instance,
                profile=instance.profile or names.get((index, instance.index), ("", ""))[0],
                uuid=instance.uuid or names.get((index, instance.index), ("", ""))[1],
            )
            for instance in _instances(gpu, processes)
        )
        cards.append(
            Card(
                index=index,
                name=(gpu.findtext("product_name") or "").strip() or "NVIDIA GPU",
                uuid=(gpu.findtext("uuid") or "").strip(),
                memory_mb=total,
                memory_free_mb=free,
                pci_bus_id=(gpu.findtext("pci/pci_bus_id") or gpu.get("id") or "").strip(),
                mig_current=(gpu.findtext("mig_mode/current_mig") or "N/A").strip(),
                mig_pending=(gpu.findtext("mig_mode/pending_mig") or "N/A").strip(),
                instances=instances,
                processes=processes,
                utilization_percent=leading_int(gpu.findtext("utilization/gpu_util")),
                memory_bandwidth_percent=leading_int(gpu.findtext("utilization/memory_util")),
                sm_clock_mhz=leading_int(gpu.findtext("clocks/sm_clock")),
                ecc_uncorrected=_ecc_uncorrected(gpu),
                temperature_c=leading_int(gpu.findtext("temperature/gpu_temp")),
                power_w=_power_draw(gpu),
            )
        )
    driver = (root.findtext("driver_version") or "").strip()
    return GpuReport(
        cards=tuple(cards), driver_version="" if driver == "N/A" else driver, reader="nvidia-smi"
    )


def _ecc_uncorrected(gpu: ET.Element) -> int | None:
    """Volatile uncorrected ECC errors: SRAM and DRAM uncorrectable, or double-bit on older cards.

    Drivers from the 570 series on split the SRAM count into ``sram_uncorrectable_parity`` and
    ``sram_uncorrectable_secded``; older ones write ``sram_uncorrectable``, and pre-Volta
    layouts ``double_bit/total``.
    """
    volatile = gpu.find("ecc_errors/volatile")
    if volatile is None:
        return None
    counts = {e.tag: leading_int(e.text) for e in volatile if "_uncorrectable" in e.tag}
    if any(tag.startswith("sram_uncorrectable_") for tag in counts):
        counts.pop("sram_uncorrectable", None)  # a total beside its parts would count twice
    numbers = [n for n in counts.values() if n is not None]
    if numbers:
        return sum(numbers)
    return leading_int(volatile.findtext("double_bit/total"))


def _power_draw(gpu: ET.Element) -> float | None:
    """Watts drawn now: ``instant_power_draw`` (570 drivers on), else ``power_draw``, else the average."""
    for readings in ("gpu_power_readings", "power_readings"):
        for tag in ("instant_power_draw", "power_draw", "average_power_draw"):
            watts = _leading_float(gpu.findtext(f"{readings}/{tag}"))
            if watts is not None:
                return watts
    return None


_CARD_LINE = re.compile(r"^GPU (\d+):")
_MIG_LINE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID:\s*(MIG-[^)\s]+)\)")


def parse_listing(text: str) -> dict[tuple[int, int], tuple[str, str]]:
    """``nvidia-smi -L``: (card, MIG device) → (profile, MIG UUID)."""
    found: dict[tuple[int, int], tuple[str, str]] = {}
    card = -1
    for line in text.splitlines():
        if match := _CARD_LINE.match(line):
            card = int(match.group(1))
        elif (match := _MIG_LINE.match(line)) and card >= 0:
            found[(card, int(match.group(2)))] = (normalise_profile(match.group(1)), match.group(3))
    return found


_NVLINK_LINE = re.compile(r"^\s+Link (\d+): ([A-Za-z ]+?) Errors?: (\d+)")


def parse_nvlink_errors(text: str) -> dict[int, dict[int, dict[str, int]]]:
    """``nvidia-smi nvlink -e``: card → link → counter (``replay``, ``recovery``, ``crc``) → count."""
    found: dict[int, dict[int, dict[str, int]]] = {}
    card = -1
    for line in text.splitlines():
        if match := _CARD_LINE.match(line):
            card = int(match.group(1))
        elif (match := _NVLINK_LINE.match(line)) and card >= 0:
            counter = match.group(2).strip().lower().replace(" ", "_")
            found.setdefault(card, {}).setdefault(int(match.group(1)), {})[counter] = int(match.group(3))
    return found


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


class NvidiaSmi:
    """The cards as ``nvidia-smi`` reports them."""

    name = "nvidia-smi"

    def __init__(self, binary: str = "nvidia-smi", timeout: float = NVIDIA_SMI_TIMEOUT) -> None:
        self.binary = binary
        self.timeout = timeout
        self.last_xml = ""
        """The last full ``-q -x`` report read, kept for the minute's full report."""

    async def read(self) -> GpuReport | None:
        text = await run_nvidia_smi(self.binary, "-q", "-x", timeout=self.timeout)
        if text is None:
            return None
        try:
            report = parse_report(text)
        except ET.ParseError as error:
            log.warning(
                "%s -q -x printed something that is not XML (%s); reporting no NVIDIA cards "
                "(check the nvidia-smi on PATH is NVIDIA's)",
                self.binary,
                error,
            )
            return None
        self.last_xml = text
        if any(i.profile == "" or i.uuid == "" for c in report.cards for i in c.instances):
            listing = await run_nvidia_smi(self.binary, "-L", timeout=self.timeout)
            if listing:
                report = parse_report(text, listing)
        return report

    async def nvlink_errors(self) -> dict[int, dict[int, dict[str, int]]]:
        text = await run_nvidia_smi(self.binary, "nvlink", "-e", timeout=self.timeout)
        return parse_nvlink_errors(text) if text else {}
