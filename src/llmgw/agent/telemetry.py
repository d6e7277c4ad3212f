"""Telemetry: what the cards are doing, sampled, and what else holds them.

Every ``interval_s`` the :class:`Sampler` reads the cards through its
:class:`~llmgw.agent.gpus.GpuSource` and makes a :class:`~llmgw.core.telemetry.Telemetry`: per
device (a card, or a MIG instance with its card's heat, power and ECC and no
utilisation) the utilisation, memory and memory bandwidth in use, SM clock
and uncorrected ECC errors, and the processes on each device that are none of
this agent's engines. Every ``full_every_s`` (a minute) the message is a full
one: it also carries nvidia-smi's full report when a second reader is given,
the NVLink error counters and the Xid lines the kernel logged since the last.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import shutil
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path

from llmgw.agent.gpus import Card, GpuReport, GpuSource, devices_of, processes_by_device
from llmgw.core.mig import device_label, mig_number
from llmgw.core.telemetry import DeviceSample, ForeignProcess, NvLinkErrors, Telemetry, XidEvent

log = logging.getLogger(__name__)

SAMPLE_INTERVAL_S = 10.0
"""Seconds between samples."""

KernelLog = Callable[[], Awaitable[str]]
"""Reads the kernel's ring buffer (``dmesg``); empty text when it cannot."""

_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.\d)?\): (\d+)")


def parse_xid_lines(text: str) -> list[tuple[str, int, str]]:
    """(PCI address ``0000:07:00``, Xid, the line) for each Xid line of a kernel log."""
    found = []
    for line in text.splitlines():
        match = _XID.search(line)
        if match:
            domain, bus, device = match.group(1).split(":")
            found.append(
                (f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}", int(match.group(2)), line.strip())
            )
    return found


def card_of_pci(cards: Collection[Card], address: str) -> int:
    """The index of the card at a kernel PCI address (``0000:07:00``), or -1."""
    for card in cards:
        parts = card.pci_bus_id.lower().split(":")
        if len(parts) == 3:
            domain, bus, device = parts
            if f"{int(domain, 16):04x}:{bus}:{device.split('.')[0]}" == address:
                return card.index
    return -1


def samples_of(report: GpuReport) -> list[DeviceSample]:
    """One sample per placement device; MIG instances carry no utilisation."""
    classes = {d.index: d.device_class for d in devices_of(report)}
    samples = []
    for card in report.cards:
        shared = DeviceSample(
            device=card.index,
            uuid=card.uuid,
            device_class=classes.get(card.index, ""),
            memory_used_mb=card.memory_mb - card.memory_free_mb,
            memory_total_mb=card.memory_mb,
            sm_clock_mhz=card.sm_clock_mhz,
            ecc_uncorrected=card.ecc_uncorrected,
            temperature_c=card.temperature_c,
            power_w=card.power_w,
        )
        if card.mig_enabled and card.instances:
            for instance in card.instances:
                number = mig_number(card.index, instance.index)
                samples.append(
                    dataclasses.replace(
                        shared,
                        device=number,
                        uuid=instance.uuid,
                        device_class=classes.get(number, ""),
                        memory_used_mb=instance.memory_mb - instance.memory_free_mb,
                        memory_total_mb=instance.memory_mb,
                    )
                )
            continue
        samples.append(
            dataclasses.replace(
                shared,
                utilization_percent=card.utilization_percent,
                memory_bandwidth_percent=card.memory_bandwidth_percent,
            )
        )
    return samples


def foreign_processes(report: GpuReport, own_pids: Collection[int]) -> list[ForeignProcess]:
    """Processes on each device that are none of this agent's engines (nor their children)."""
    return [
        ForeignProcess(device=device, pid=process.pid, name=process.name, used_mb=process.used_mb)
        for device, processes in processes_by_device(report).items()
        for process in processes
        if process.pid not in own_pids
    ]


def parse_parent_pid(stat: str) -> int | None:
    """The parent pid in a ``/proc/PID/stat`` line (the field after the command's closing parenthesis)."""
    fields = stat.rpartition(")")[2].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def descendants(pid: int, proc_root: Path = Path("/proc")) -> set[int]:
    """``pid`` and every process below it: the agent's engines and what they started."""
    children: dict[int, list[int]] = {}
    for entry in proc_root.iterdir() if proc_root.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            parent = parse_parent_pid((entry / "stat").read_text(errors="replace"))
        except OSError:
            continue
        if parent is not None:
            children.setdefault(parent, []).append(int(entry.name))
    found, stack = {pid}, [pid]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


async def read_dmesg(timeout: float = 10.0) -> str:
    """The kernel's ring buffer through ``dmesg``; empty when it is missing or refused."""
    binary = shutil.which("dmesg")
    if binary is None:
        return ""
    process = await asyncio.create_subprocess_exec(
        binary, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        stdout, _ = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        return ""
    return stdout.decode(errors="replace") if process.returncode == 0 else ""


class Sampler:
    """Makes :class:`Telemetry` samples from a card reader, the engines' pids and the kernel log."""

    def __init__(
        self,
        source: GpuSource,
        own_pids: Callable[[], Collection[int]] = frozenset,
        *,
        full_report: GpuSource | None = None,
        kernel_log: KernelLog = read_dmesg,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        full_every_s: float = 60.0,
    ) -> None:
        self.source = source
        self.own_pids = own_pids
        self.full_report = full_report
        """A second reader (nvidia-smi) read on full samples; its processes count too."""
        self.kernel_log = kernel_log
        self.clock = clock
        self.wall_clock = wall_clock
        self.full_every_s = full_every_s
        self.last_full: GpuReport | None = None
        self._next_full = float("-inf")
        self._seen_xids: deque[str] = deque(maxlen=4096)

    async def sample(self) -> Telemetry | None:
        """One sample, a full one when a minute has passed; None without cards."""
        report = await self.source.read()
        if report is None:
            return None
        sampled_unix_ms = int(self.wall_clock() * 1000)
        own = set(self.own_pids())
        foreign = {(f.device, f.pid): f for f in foreign_processes(report, own)}
        nvlink: list[NvLinkErrors] = []
        xids: list[XidEvent] = []
        now = self.clock()
        full = now >= self._next_full
        if full:
            self._next_full = now + self.full_every_s
            if self.full_report is not None:
                self.last_full = await self.full_report.read()
                if self.last_full is not None:
                    for process in foreign_processes(self.last_full, own):
                        foreign.setdefault((process.device, process.pid), process)
            for card, links in sorted((await self.source.nvlink_errors()).items()):
                for link, counters in sorted(links.items()):
                    nvlink.append(NvLinkErrors(card=card, link=link, counters=dict(counters)))
            xids.extend(await self._new_xids(report))
        return Telemetry(
            sampled_unix_ms=sampled_unix_ms,
            samples=tuple(samples_of(report)),
            foreign=tuple(foreign.values()),
            full=full,
            nvlink=tuple(nvlink),
            xids=tuple(xids),
            reader=report.reader,
        )

    async def _new_xids(self, report: GpuReport) -> list[XidEvent]:
        events = []
        for address, xid, line in parse_xid_lines(await self.kernel_log()):
            if line in self._seen_xids:
                continue
            self._seen_xids.append(line)
            events.append(XidEvent(card=card_of_pci(report.cards, address), xid=xid, line=line))
        return events

    async def run(self, publish: Callable[[Telemetry], None], interval_s: float = SAMPLE_INTERVAL_S) -> None:
        """Sample every ``interval_s`` and hand each sample to ``publish``, until cancelled."""
        while True:
            started = self.clock()
            try:
                telemetry = await self.sample()
            except Exception:
                log.exception("reading the cards for telemetry failed; trying again in %.0f s", interval_s)
                telemetry = None
            if telemetry is not None:
                _log_news(telemetry)
                publish(telemetry)
            await asyncio.sleep(max(0.0, interval_s - (self.clock() - started)))


def _log_news(telemetry: Telemetry) -> None:
    """Xid lines and foreign processes are worth a line in the agent's log too."""
    for event in telemetry.xids:
        log.warning("card %d: Xid %d in the kernel log: %s", event.card, event.xid, event.line)
    if telemetry.full:
        for process in telemetry.foreign:
            log.warning(
                "device %s: process %d (%s) holds %d MiB and is not one of llmgw's engines",
                device_label(process.device),
                process.pid,
                process.name or "unknown",
                process.used_mb,
            )
